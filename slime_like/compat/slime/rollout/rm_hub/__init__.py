"""slime.rollout.rm_hub: score samples with the run's reward (--custom-rm-path or --rm-type), and slime's helpers.

Differences from slime: without a per-sample `custom_rm_path`, `async_rm` uses the reward this run is
configured with (our --rm-type names), and `batched_async_rm` calls a --custom-rm-path function with the
whole list only under --group-rm (slime does whenever the path is set).
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from slime.rollout.rm_hub.deepscaler import get_deepscaler_rule_based_reward
from slime.rollout.rm_hub.f1 import f1_score
from slime.rollout.rm_hub.math_dapo_utils import compute_score as compute_score_dapo
from slime.rollout.rm_hub.math_utils import extract_boxed_answer, grade_answer_verl
from slime.utils.misc import load_function
from slime.utils.types import Sample

from rollout.context import current_context
from rollout.rewards import RewardFunction, get_reward_function

__all__ = [
    "async_rm",
    "batched_async_rm",
    "compute_score_dapo",
    "extract_boxed_answer",
    "f1_score",
    "get_deepscaler_rule_based_reward",
    "grade_answer_verl",
]

_outside: dict[int, RewardFunction] = {}


def _reward(args: Any) -> RewardFunction:
    """The running rollout's reward function, else one built from `args` (once per args)."""
    ctx = current_context()
    if ctx is not None and ctx.hooks is not None:
        return ctx.hooks.reward
    if id(args) not in _outside:
        _outside[id(args)] = get_reward_function(args)
    return _outside[id(args)]


async def async_rm(args: Any, sample: Sample, **kwargs: Any) -> Any:
    """One sample's reward: its own `custom_rm_path` if set, else the run's reward function."""
    if sample.custom_rm_path:
        out = load_function(sample.custom_rm_path)(args, sample, **kwargs)
        return await out if inspect.isawaitable(out) else out
    return await _reward(args).compute(args, sample)


async def batched_async_rm(args: Any, samples: list[Sample], **kwargs: Any) -> list[Any]:
    """The rewards of several samples: one call of a --group-rm function, else one `async_rm` each."""
    reward = _reward(args)
    if reward.per_group:
        return list(await reward.compute(args, samples))
    return list(await asyncio.gather(*(async_rm(args, s, **kwargs) for s in samples)))
