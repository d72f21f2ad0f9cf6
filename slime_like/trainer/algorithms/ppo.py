"""PPO with a learned critic: GAE advantages and the clipped value loss.

Generalized Advantage Estimation (Schulman et al., 2016, "High-Dimensional Continuous Control Using
Generalized Advantage Estimation", eq. 16), over the action tokens of a sample in order, with
V = 0 after the last one:
    delta_t = r_t + gamma * V_(t+1) - V_t,    A_t = delta_t + gamma * lambda * A_(t+1),
    return_t = A_t + V_t (the critic's regression target)
where r_t are the KL-shaped token rewards of returns.py (--kl-coef) and V_t is the critic's value
of the state before token t. Value clipping (as in the PPO baselines; Schulman et al., 2017):
    loss = 0.5 * max((V - R)^2, (V_old + clip(V - V_old, -eps_v, eps_v) - R)^2)
so one step cannot move a value by more than eps_v (--value-clip) from the rollout's estimate.
"""

from __future__ import annotations

import torch


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lambd: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns) of one sample's action tokens; 0 on masked-out tokens."""
    actions = mask.nonzero().flatten().tolist()
    advantages = torch.zeros_like(rewards, dtype=torch.float32)
    next_value, running = 0.0, 0.0
    for t in reversed(actions):
        delta = float(rewards[t]) + gamma * next_value - float(values[t])
        running = delta + gamma * lambd * running
        advantages[t] = running
        next_value = float(values[t])
    returns = (advantages + values.float()) * mask
    return advantages, returns


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, value_clip: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped value loss and a 0/1 tensor marking tokens where the clipped term was taken."""
    unclipped = (values - returns) ** 2
    if value_clip is None:
        return 0.5 * unclipped, torch.zeros_like(unclipped)
    clipped_values = old_values + torch.clamp(values - old_values, -value_clip, value_clip)
    clipped = (clipped_values - returns) ** 2
    return 0.5 * torch.maximum(unclipped, clipped), (clipped > unclipped).float()
