"""Token-level rewards with a KL penalty, discounted returns, and batch whitening of advantages.

KL as reward shaping (Ouyang et al., 2022, "Training language models to follow instructions with
human feedback", eq. 2; Stiennon et al., 2020): every action token t gets r_t = -beta * kl_t with
kl_t = log pi_old(y_t) - log pi_ref(y_t) (the k1 estimate), and the last action token also gets the
sequence reward R. The discounted return is G_t = sum_{k >= t} gamma^(k - t) * r_k.

Only loss-masked tokens are actions: tokens a tool or user wrote in a multi-turn sample (mask 0)
get no reward, no KL and advantage 0, and the recursion runs over the action tokens in order.

Whitening (advantage normalisation) uses the mean and population variance over all loss-masked
tokens of the whole rollout: (A - mean) / sqrt(var + 1e-8). A data-parallel rank holds only its share of the
rollout: its per-row sums are gathered into rollout order (one all-reduce each), so every rank adds the same
numbers in the same order as one process holding the whole rollout would.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def shaped_token_rewards(
    reward: float, mask: torch.Tensor, kl: torch.Tensor | None = None, kl_coef: float = 0.0
) -> torch.Tensor:
    """r_t = -kl_coef * kl_t on action tokens, plus the sequence reward on the last action token."""
    rewards = torch.zeros_like(mask, dtype=torch.float32)
    if kl is not None and kl_coef:
        rewards = -kl_coef * kl.float() * mask
    actions = mask.nonzero().flatten()
    if len(actions):
        rewards[actions[-1]] += reward
    return rewards


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_(next action token) on action tokens; 0 elsewhere."""
    actions = mask.nonzero().flatten().tolist()
    returns = torch.zeros_like(rewards)
    running = 0.0
    for t in reversed(actions):
        running = float(rewards[t]) + gamma * running
        returns[t] = running
    return returns


RowGather = Callable[[list[float]], list[float]]  # per-row values of this rank's rows -> of every rollout row


def _whole(rows: list[float]) -> list[float]:
    return rows


def masked_whiten(
    values: list[torch.Tensor], masks: list[torch.Tensor], eps: float = 1e-8, gather: RowGather = _whole
) -> list[torch.Tensor]:
    """(v - mean) / sqrt(var + eps) over all masked tokens of all rows (of every rank's rows, via `gather`);
    masked-out tokens get 0."""
    count = max(1.0, sum(gather([float(m.sum()) for m in masks])))
    mean = sum(gather([float((v * m).sum()) for v, m in zip(values, masks, strict=True)])) / count
    var = sum(gather([float((((v - mean) ** 2) * m).sum()) for v, m in zip(values, masks, strict=True)])) / count
    scale = (var + eps) ** -0.5
    return [(v - mean) * scale * m for v, m in zip(values, masks, strict=True)]
