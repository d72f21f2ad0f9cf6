"""GSPO: PPO clipping on a sequence-level importance ratio.

Group Sequence Policy Optimization (Zheng et al., 2025, "Group Sequence Policy Optimization",
arXiv:2507.18071) replaces the per-token ratio with the length-normalised sequence ratio
    s_i = exp( (1/|y_i|) * sum_t [log pi(y_t) - log pi_old(y_t)] )
and clips s_i like PPO, with the group-normalised advantage of GRPO. We use the paper's
GSPO-token variant: s_it = sg[s_i] * pi(y_t) / sg[pi(y_t)], whose value is s_i on every
token and whose gradient, averaged over the sequence's tokens (--loss-agg-mode
seq-mean-token-mean, the paper's objective), equals the gradient of GSPO's sequence objective.
"""

from __future__ import annotations

import torch

from slime_like.trainer.algorithms.policy_loss import PolicyLossOutput, ppo_clip_loss


def sequence_log_ratio(
    log_probs: torch.Tensor, old_log_probs: torch.Tensor, mask: torch.Tensor, lengths: list[int] | None = None
) -> torch.Tensor:
    """(1/|y|) * sum over loss-masked tokens of log pi - log pi_old: a scalar for one sequence, or per
    token (each token carries its sequence's value) for sequences of `lengths` concatenated."""
    if lengths is None:
        return ((log_probs - old_log_probs) * mask).sum() / mask.sum().clamp(min=1.0)
    device = log_probs.device
    segment = torch.repeat_interleave(torch.arange(len(lengths), device=device), torch.tensor(lengths, device=device))
    sums = log_probs.new_zeros(len(lengths)).index_add_(0, segment, (log_probs - old_log_probs) * mask)
    counts = mask.new_zeros(len(lengths)).index_add_(0, segment, mask).clamp(min=1.0)
    return (sums / counts)[segment]


def gspo_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float,
    eps_clip_c: float | None = None,
    lengths: list[int] | None = None,
) -> PolicyLossOutput:
    """Per-token GSPO-token loss of one sequence (or of concatenated sequences of `lengths`)."""
    seq = sequence_log_ratio(log_probs, old_log_probs, mask, lengths).detach()
    token_log_ratio = seq + log_probs - log_probs.detach()
    return ppo_clip_loss(token_log_ratio, torch.zeros_like(log_probs), advantages, eps_clip, eps_clip_high, eps_clip_c)
