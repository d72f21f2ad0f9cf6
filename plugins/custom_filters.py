"""Example filters and a reward post-process, one per hook.

    --dynamic-sampling-filter-path plugins.custom_filters.drop_all_truncated     (which finished groups train)
    --buffer-filter-path plugins.custom_filters.most_progress_first              (which returned groups run next)
    --rollout-sample-filter-path plugins.custom_filters.exclude_truncated        (which samples the loss sees)
    --custom-reward-post-process-path plugins.custom_filters.overlong_penalty    (training rewards)

The built-in dynamic filter is rollout.filters.check_reward_nonzero_std (DAPO: drop zero-variance groups).
"""

from __future__ import annotations

from typing import Any

from rollout.filters import FilterResult, check_reward_nonzero_std
from slime_like.core.sample import Sample, Status

OVERLONG_BUFFER = 64  # tokens before the length limit where the DAPO soft penalty starts


def drop_all_truncated(args: Any, group: list[Sample]) -> FilterResult:
    """Drop groups in which every sample hit the length limit, then apply the zero-variance check."""
    if all(s.status == Status.TRUNCATED for s in group):
        return FilterResult(False, "all_truncated")
    return check_reward_nonzero_std(args, group)


def most_progress_first(args: Any, groups: list[list[Sample]], num_groups: int) -> list[list[Sample]]:
    """Continue the returned groups that have generated the most tokens first (they finish soonest)."""
    return sorted(groups, key=lambda g: -sum(s.response_length for s in g))[:num_groups]


def exclude_truncated(args: Any, group: list[Sample]) -> list[bool]:
    """Truncated samples keep their place in the group's reward statistics but get no loss."""
    return [s.status != Status.TRUNCATED for s in group]


def overlong_penalty(args: Any, group: list[Sample]) -> list[float]:
    """DAPO soft overlong punishment: a linear penalty (down to -1) over the last OVERLONG_BUFFER tokens."""
    limit = args.rollout_max_response_len
    start = max(0, limit - OVERLONG_BUFFER)
    out = []
    for s in group:
        reward = s.reward[args.reward_key] if isinstance(s.reward, dict) else float(s.reward or 0.0)
        over = max(0, s.response_length - start)
        out.append(reward - min(1.0, over / max(1, limit - start)))
    return out
