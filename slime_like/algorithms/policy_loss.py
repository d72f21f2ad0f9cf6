"""PPO clipped surrogate objective with asymmetric clipping.

Per token, with ratio r = exp(log pi(a|s) - log pi_old(a|s)) and advantage A:
    loss = max(-A * r, -A * clip(r, 1 - eps_low, 1 + eps_high))
which is the negated clipped surrogate of PPO (Schulman et al., 2017, "Proximal Policy
Optimization Algorithms", eq. 7). An upper bound larger than the lower one is DAPO's
"clip-higher" (Yu et al., 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale").
"""

from __future__ import annotations

import torch


def ppo_clip_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token loss, ratio, and a 0/1 tensor marking tokens where the clipped term was taken."""
    ratio = torch.exp(log_probs - old_log_probs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - eps_clip, 1.0 + eps_clip_high)
    loss = torch.maximum(unclipped, clipped)
    return loss, ratio, (clipped > unclipped).float()
