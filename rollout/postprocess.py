"""After a rollout: the sample filter (which samples the loss sees) and the reward post-process (training rewards)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rollout import slime_contract
from rollout.context import RolloutContext
from rollout.hooks import REWARD_POST_PROCESS_FLAG, SAMPLE_FILTER_FLAG
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
            if keep:
                continue
            sample.loss_mask = [0] * sample.response_length
            sample.metadata["excluded_from_loss"] = True
            ctx.count("samples_excluded_from_loss")


def apply_reward_post_process(ctx: RolloutContext, groups: list[list[Sample]], fn: Callable[..., Any]) -> None:
    """Replace each sample's reward by the post-processed one; the scored reward stays in metadata["raw_reward"]."""
    for group in groups:
        new = _per_sample(fn(ctx.args, group), group, "--custom-reward-post-process-path")
        for sample, reward in zip(group, new, strict=True):
            sample.metadata["raw_reward"] = sample.reward
            sample.reward = float(reward)


def exclude_removed_samples(ctx: RolloutContext, groups: list[list[Sample]]) -> None:
    """Samples with `remove_sample` set (slime's flag) get loss mask 0, as the sample filter's rejects do."""
    for sample in (s for g in groups for s in g):
        if sample.remove_sample and not sample.metadata.get("excluded_from_loss"):
            sample.loss_mask = [0] * sample.response_length
            sample.metadata["excluded_from_loss"] = True
            ctx.count("samples_excluded_from_loss")


def finish_rollout(ctx: RolloutContext, groups: list[list[Sample]]) -> None:
    """Apply the configured post-rollout hooks to the groups that will train (slime's once, on all groups)."""
    hooks = ctx.hooks
    if hooks.sample_filter is not None:
        if hooks.follows_slime(SAMPLE_FILTER_FLAG):
            slime_contract.apply_sample_filter(ctx, groups, hooks.sample_filter)
        else:
            apply_sample_filter(ctx, groups, hooks.sample_filter)
    exclude_removed_samples(ctx, groups)
    if hooks.reward_post_process is not None:
        if hooks.follows_slime(REWARD_POST_PROCESS_FLAG):
            slime_contract.apply_reward_post_process(ctx, groups, hooks.reward_post_process)
        else:
            apply_reward_post_process(ctx, groups, hooks.reward_post_process)
