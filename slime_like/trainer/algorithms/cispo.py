"""CISPO: REINFORCE on every token with a clipped, stop-gradient importance weight.

Clipped IS-weight Policy Optimization (MiniMax, 2025, "MiniMax-M1: Scaling Test-Time Compute
Efficiently with Lightning Attention", arXiv:2506.13585):
    J = (1 / sum_i |o_i|) * sum_i sum_t sg[clip(r_it, 1 - eps_low, 1 + eps_high)] * A_it * log pi(o_it)
Unlike PPO no token is dropped from the gradient: the weight is clipped, not the objective.
The paper sets no lower bound in practice (here: --eps-clip 1.0); it aggregates per token
(--loss-agg-mode token-mean) and uses GRPO's group-normalised advantages.
"""

from __future__ import annotations

import torch

from slime_like.trainer.algorithms.policy_loss import PolicyLossOutput


def cispo_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float,
) -> PolicyLossOutput:
    """Per-token loss -sg[clip(r)] * A * log pi; its gradient is -clip(r) * A * grad log pi."""
    ratio = torch.exp(log_probs - old_log_probs)
    weight = torch.clamp(ratio, 1.0 - eps_clip, 1.0 + eps_clip_high).detach()
    loss = -weight * advantages * log_probs
    clipped = (weight != ratio.detach()).float()
    return PolicyLossOutput(loss, ratio, clipped, torch.zeros_like(loss))
