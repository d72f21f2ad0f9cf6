"""PPO clipped surrogate objective with asymmetric clipping and dual-clip.

Per token, with ratio r = exp(log pi(a|s) - log pi_old(a|s)) and advantage A:
    loss = max(-A * r, -A * clip(r, 1 - eps_low, 1 + eps_high))
which is the negated clipped surrogate of PPO (Schulman et al., 2017, "Proximal Policy
Optimization Algorithms", eq. 7). An upper bound larger than the lower one is DAPO's
"clip-higher" (Yu et al., 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale").

Dual-clip (Ye et al., 2020, "Mastering Complex Control in MOBA Games with Deep Reinforcement
Learning", arXiv:1912.09729): for A < 0 the loss is also capped at -c * A (c > 1), so a
token whose ratio exploded cannot dominate the step; the capped tokens get no gradient.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class PolicyLossOutput(NamedTuple):
    """Per-token loss and the diagnostics every policy objective reports."""

    loss: torch.Tensor
    ratio: torch.Tensor
    clipped: torch.Tensor  # 1.0 where the clipped term was taken
    dual_clipped: torch.Tensor  # 1.0 where the dual-clip cap was taken


def ppo_clip_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float,
    eps_clip_c: float | None = None,
) -> PolicyLossOutput:
    """Per-token clipped PPO loss (dual-clipped for negative advantages when eps_clip_c is set)."""
    ratio = torch.exp(log_probs - old_log_probs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - eps_clip, 1.0 + eps_clip_high)
    loss = torch.maximum(unclipped, clipped)
    clipped_mask = (clipped > unclipped).float()
    dual = torch.zeros_like(loss)
    if eps_clip_c is not None:
        cap = -advantages * eps_clip_c
        dual_mask = (advantages < 0) & (loss > cap)
        loss = torch.where(dual_mask, cap, loss)
        dual = dual_mask.float()
    return PolicyLossOutput(loss, ratio, clipped_mask, dual)
