"""After a rollout: group accounting of custom rollouts, the sample filter (which samples the loss sees) and the
reward post-process (training rewards)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from buffer.accounting import AccountingError, failure_reason
from rollout import slime_contract
from rollout.context import RolloutContext
from slime_like.core.sample import Sample


def _per_sample(result: Any, group: list[Sample], flag: str) -> list[Any]:
    if not isinstance(result, list | tuple) or len(result) != len(group):
        raise TypeError(f"{flag}: must return a list with one entry per sample of the group ({len(group)})")
    return list(result)


def apply_sample_filter(ctx: RolloutContext, groups: list[list[Sample]], fn: Callable[..., Any]) -> None:
    """Samples the filter rejects stay in their group (and its reward statistics) but get loss mask 0."""
    for group in groups:
        for sample, keep in zip(
            group, _per_sample(fn(ctx.args, group), group, "--rollout-sample-filter-path"), strict=True
        ):
            if not keep:
                sample.exclude_from_loss()
                ctx.count("samples_excluded_from_loss")


def apply_reward_post_process(ctx: RolloutContext, groups: list[list[Sample]], fn: Callable[..., Any]) -> None:
    """Replace each sample's reward by the post-processed one; the scored reward stays in metadata["raw_reward"]."""
    for group in groups:
        new = _per_sample(fn(ctx.args, group), group, "--custom-reward-post-process-path")
        for sample, reward in zip(group, new, strict=True):
            sample.metadata["raw_reward"] = sample.reward
            sample.reward = float(reward)


def account_custom_rollout(ctx: RolloutContext, groups: list[list[Sample]]) -> None:
    """What can be checked of a --rollout-function-path rollout: no group or sample twice; trained/failed counts.

    Such a function draws, drops and hands back groups itself (slime's contract has no way to report a drop),
    so drawn = trained + failed + dropped + returned is checked for the built-in loop only (rollout/sampling.py).
    """
    seen_groups: set[int] = set()
    seen_samples: set[int] = set()
    counts: dict[str, int] = {"groups_trained": 0, "groups_failed": 0}
    for group in groups:
        twice = [s.index for s in group if id(s) in seen_samples]
        if id(group) in seen_groups or twice:
            what = f"samples {twice}" if twice else f"a group (first sample {group[0].index if group else None})"
            raise AccountingError(
                f"--rollout-function-path returned {what} twice: each would train twice; return every group once"
            )
        seen_groups.add(id(group))
        seen_samples.update(id(s) for s in group)
        reason = failure_reason(group)
        key = "groups_trained" if reason is None else f"groups_failed_{reason}"
        counts[key] = counts.get(key, 0) + 1
        counts["groups_failed"] += reason is not None
    for key, n in counts.items():
        ctx.count(key, n)


def finish_rollout(ctx: RolloutContext, groups: list[list[Sample]]) -> None:
    """Apply the configured post-rollout hooks to the groups that will train (each in the contract the loader
    made of it: rollout/hooks.py)."""
    hooks = ctx.hooks
    if ctx.accounting is None:  # a custom rollout function: the built-in loop has accounted for its groups
        account_custom_rollout(ctx, groups)
    if hooks.filter_samples is not None:
        hooks.filter_samples(ctx, groups)
    slime_contract.exclude_removed_samples(ctx, groups)  # slime's `remove_sample`, whichever hook set it
    if hooks.process_all_samples is not None and ctx.accounting is not None:  # the built-in loop's only
        hooks.process_all_samples(ctx, groups)
    if hooks.post_process_rewards is not None:
        hooks.post_process_rewards(ctx, groups)
