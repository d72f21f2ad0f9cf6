"""On-policy distillation (OPD), as slime's --use-opd: a teacher's per-token reverse KL penalises the advantage.

The student samples its own responses; a teacher scores each sampled token (its log-prob of that token given the
same prefix). Following Agarwal et al. (2024, "On-Policy Distillation of Language Models: Learning from
Self-Generated Mistakes", GKD) and Thinking Machines' on-policy distillation recipe (Lu et al., 2025), the
per-token reverse KL estimate k_t = log pi_student(y_t) - log pi_teacher(y_t) is a penalty on the token's
advantage:
    A'_t = A_t - c * k_t,     c = --opd-kl-coef
on top of any estimator (with a zero task reward it is pure distillation). The student log-probs are the ones the
estimator saw (the old policy's). Returns (ppo's critic targets) are not changed, as in slime; the penalty is
added before --normalize-advantages whitens, as in slime. Tokens outside the loss mask keep advantage 0.
"""

from __future__ import annotations

import torch


def opd_advantages(
    advantages: list[torch.Tensor],
    student_log_probs: list[torch.Tensor],
    teacher_log_probs: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
    kl_coef: float,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The penalised advantages and each sample's per-token reverse KL estimate (for the metrics)."""
    out, kls = [], []
    for i, (adv, student, teacher, mask) in enumerate(
        zip(advantages, student_log_probs, teacher_log_probs, loss_masks, strict=True)
    ):
        if teacher.shape != student.shape:
            raise ValueError(
                f"--use-opd: sample {i} has {teacher.numel()} teacher log-probs for {student.numel()} response "
                "tokens (the teacher must score exactly the sampled response tokens)"
            )
        kl = (student - teacher.to(student.dtype)) * mask
        out.append((adv - kl_coef * kl) * mask)
        kls.append(kl)
    return out, kls
