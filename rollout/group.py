"""Run one group: generate its unfinished samples (per sample or per group), then score it."""

from __future__ import annotations

import asyncio
from typing import Any

from rollout.context import RolloutContext
from rollout.generate import FINISHED
from slime_like.core.sample import Sample, Status


async def _generate_sample(ctx: RolloutContext, sample: Sample, params: dict[str, Any]) -> None:
    out = await ctx.hooks.generate(ctx, sample, params)
    if out is not sample:
        raise TypeError("--custom-generate-function-path must return the Sample it was given, updated")


async def _generate_group(ctx: RolloutContext, group: list[Sample], params: dict[str, Any]) -> None:
    out = await ctx.hooks.generate(ctx, group, params)
    if not isinstance(out, list) or len(out) != len(group) or not all(isinstance(s, Sample) for s in out):
        raise TypeError(
            f"--custom-generate-function-path with --group-generate must return a list of {len(group)} Samples"
        )
    group[:] = out


async def run_group(ctx: RolloutContext, group: list[Sample], params: dict[str, Any]) -> bool:
    """Generate and score a group in place; False if it was aborted before every sample finished (not scored)."""
    failed_before = {id(s) for s in group if s.status == Status.FAILED}
    if ctx.hooks.group_generate:
        # A group-level function sees the whole group, finished samples included, and continues what it must.
        await _generate_group(ctx, group, params)
    else:
        todo = [s for s in group if s.status not in FINISHED]
        await asyncio.gather(*(_generate_sample(ctx, s, params) for s in todo))
    for sample in group:
        if sample.status == Status.PENDING:
            sample.status = Status.COMPLETED  # a custom function that set no status finished normally
        if sample.status == Status.FAILED and id(sample) not in failed_before and "generate_error" in sample.metadata:
            ctx.count("generate_failed")
    if any(s.status == Status.ABORTED for s in group):
        return False
    await ctx.hooks.reward.score_group(ctx.args, group, ctx.count)
    return True
