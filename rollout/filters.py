"""Built-in filters: dynamic sampling (which finished groups train) and the buffer filter (which returned groups run next)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slime_like.core.sample import Sample, Status, scalar_reward


@dataclass
class FilterResult:
    """A dynamic filter's verdict on one group; `reason` names why a dropped group was dropped."""

    keep: bool
    reason: str | None = None
    # slime's fallback: a dropped group is kept after all when, without it, too few groups are kept or running.
    keep_when_insufficient: bool = False


def group_rewards(args: Any, group: list[Sample]) -> list[float]:
    """Scalar rewards of the group's usable samples (failed ones carry no reward)."""
    return [scalar_reward(s, args.reward_key) for s in group if s.status != Status.FAILED]


ZERO_STD = 1e-6


def check_reward_nonzero_std(args: Any, group: list[Sample]) -> FilterResult:
    """DAPO dynamic sampling: keep a group only if its rewards' unbiased std exceeds 1e-6, as slime does (equal
    rewards give no GRPO signal; a difference lost in rounding is no signal either)."""
    rewards = group_rewards(args, group)
    if len(rewards) < 2 or statistics.stdev(rewards) <= ZERO_STD:
        return FilterResult(False, "zero_std")
    return FilterResult(True)


def apply_dynamic_filter(fn: Callable[[Any, list[Sample]], Any] | None, args: Any, group: list[Sample]) -> FilterResult:
    """Run a dynamic filter (no filter keeps everything); a plain False is reported under the filter's name."""
    if fn is None:
        return FilterResult(True)
    verdict = fn(args, group)
    if isinstance(verdict, FilterResult):
        return verdict
    if isinstance(verdict, bool):
        return FilterResult(verdict, None if verdict else getattr(fn, "__name__", "filter"))
    raise TypeError(
        f"--dynamic-sampling-filter-path: {getattr(fn, '__name__', fn)} returned {type(verdict).__name__}; "
        "expected a bool or rollout.filters.FilterResult"
    )


def fifo_buffer_filter(args: Any, groups: list[list[Sample]], num_groups: int) -> list[list[Sample]]:
    """The default buffer filter: the groups that came back first run first."""
    return groups[:num_groups]
