"""REINFORCE++ and REINFORCE++-baseline advantages: token returns, normalised over the whole batch.

REINFORCE++ (Hu, 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language
Models", arXiv:2501.03262): no critic and no per-prompt baseline; the advantage of token t is its
return G_t under KL-shaped token rewards (see returns.py: r_t = -beta * kl_t, plus the sequence
reward on the last token), whitened with the mean and std of all tokens of the global batch.
REINFORCE++-baseline first subtracts the mean reward of the sample's prompt group from its reward
(the group baseline: group_centred, computed on the rollout side where the whole group is, buffer/group_rewards.py),
then does the same; the batch normalisation replaces GRPO's per-group std.
"""

from __future__ import annotations

import torch

from buffer.group_rewards import group_centred
from slime_like.trainer.algorithms.returns import (
    RowGather,
    _whole,
    discounted_returns,
    masked_whiten,
    shaped_token_rewards,
)


def reinforce_pp_advantages(
    rewards: list[float],
    masks: list[torch.Tensor],
    kls: list[torch.Tensor] | None,
    kl_coef: float,
    gamma: float,
    group_ids: list[int] | None = None,
    gather: RowGather = _whole,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(whitened advantages, raw returns) per sample; with group_ids it is REINFORCE++-baseline (rewards already
    centred by group are passed without). `gather` collects every rank's row sums for the whitening."""
    if group_ids is not None:
        rewards = group_centred(rewards, group_ids)
    returns = [
        discounted_returns(shaped_token_rewards(r, m, None if kls is None else kls[i], kl_coef), m, gamma)
        for i, (r, m) in enumerate(zip(rewards, masks, strict=True))
    ]
    return masked_whiten(returns, masks, gather=gather), returns
