"""On-policy distillation's advantage penalty, against values computed by hand from slime's formula
A'_t = A_t - c * (log pi_student(y_t) - log pi_teacher(y_t))."""

from __future__ import annotations

import pytest
import torch

from slime_like.trainer.algorithms.opd import opd_advantages


def test_the_penalty_is_the_scaled_reverse_kl_per_token() -> None:
    adv = [torch.tensor([1.0, 1.0, 1.0]), torch.tensor([-0.5, -0.5])]
    student = [torch.tensor([-0.2, -1.0, -3.0]), torch.tensor([-0.7, -0.1])]
    teacher = [torch.tensor([-0.2, -0.5, -1.0]), torch.tensor([-2.7, -0.1])]
    masks = [torch.tensor([1.0, 1.0, 0.0]), torch.ones(2)]
    out, kls = opd_advantages(adv, student, teacher, masks, kl_coef=0.5)
    # sample 0: k = [0, -0.5, (-2.0, masked)] -> A' = [1 - 0, 1 + 0.25, 0]
    # sample 1: k = [2.0, 0] -> A' = [-0.5 - 1.0, -0.5]
    torch.testing.assert_close(out[0], torch.tensor([1.0, 1.25, 0.0]))
    torch.testing.assert_close(out[1], torch.tensor([-1.5, -0.5]))
    torch.testing.assert_close(kls[1], torch.tensor([2.0, 0.0]))


def test_a_teacher_of_another_length_is_refused() -> None:
    with pytest.raises(ValueError, match="sample 0 has 2 teacher log-probs for 3 response tokens"):
        opd_advantages([torch.zeros(3)], [torch.zeros(3)], [torch.zeros(2)], [torch.ones(3)], 1.0)


def test_opd_comes_after_the_estimator_and_before_normalisation() -> None:
    """grpo without std: A = r - mean over the group = [0.5, -0.5]; then the teacher's penalty (c = 1)."""
    from argparse import Namespace

    from slime_like.trainer.algorithms.advantages import AdvantageInputs, compute_advantages

    args = Namespace(advantage_estimator="grpo", disable_grpo_std_normalization=True, normalize_advantages=False,
                     kl_coef=0.0, use_opd=True, opd_kl_coef=1.0)  # fmt: skip
    inputs = AdvantageInputs(
        rewards=[1.0, 0.0],
        group_ids=[0, 0],
        loss_masks=[torch.ones(2), torch.ones(1)],
        log_probs=[torch.tensor([-1.0, -1.0]), torch.tensor([-0.3])],
        teacher_log_probs=[torch.tensor([-1.0, -2.0]), torch.tensor([-0.3])],
    )
    result = compute_advantages(args, inputs)
    # sample 0: k = [0, 1] -> [0.5, -0.5]; sample 1: k = [0] -> [-0.5]
    torch.testing.assert_close(result.advantages[0], torch.tensor([0.5, -0.5]))
    torch.testing.assert_close(result.advantages[1], torch.tensor([-0.5]))
    with pytest.raises(ValueError, match="--use-opd needs each sample's teacher_log_probs"):
        compute_advantages(args, AdvantageInputs([1.0], [0], [torch.ones(1)], [torch.zeros(1)]))
