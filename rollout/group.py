"""Run one group: generate its unfinished samples (per sample or per group), then score it."""

from __future__ import annotations

import asyncio
from typing import Any

from rollout.context import RolloutContext
from rollout.generate import FINISHED
from rollout.openai_session import BRANCH_KEY
from rollout.sample_hooks import apply_sample_hooks
from slime_like.core.sample import Sample, Status


async def _generate_group(ctx: RolloutContext, group: list[Sample], params: dict[str, Any]) -> None:
    out = await ctx.hooks.generate(ctx, group, params)
    if not isinstance(out, list) or len(out) != len(group) or not all(isinstance(s, Sample) for s in out):
        raise TypeError(
            f"--custom-generate-function-path with --group-generate must return a list of {len(group)} Samples"
        )
    group[:] = out


async def _hooked(ctx: RolloutContext, sample: Sample) -> Sample:
    if sample.status == Status.ABORTED:
        return sample  # generated again later: hooked then
    hooks = ctx.hooks.sample_hooks
    return await apply_sample_hooks(hooks, ctx.args, sample, rollout_id=ctx.rollout_id, evaluation=ctx.evaluation)


def run_branches(group: list[Sample]) -> dict[int, int]:
    """Position in the group of each extra branch of an agent run -> position of the run's own sample (the one
    whose `openai_branch` is 0, with the same index: rollout/openai_session.Conversation.samples)."""
    runs = {s.index: i for i, s in enumerate(group) if s.metadata.get(BRANCH_KEY) == 0}
    return {i: runs[s.index] for i, s in enumerate(group) if s.metadata.get(BRANCH_KEY, 0) > 0 and s.index in runs}


async def run_group(ctx: RolloutContext, group: list[Sample], params: dict[str, Any]) -> bool:
    """Generate and score a group in place; False if it was aborted before every sample finished (not scored).

    A generate function may return several samples for one (they take its place in the group) and, where the
    loader says so (slime's contract: rollout/hooks.py), set rewards that are kept (except that --group-rm scores
    the whole group). Under our contract the samples after the first are other branches of the same agent run:
    they carry the first one's reward (--openai-branch-reward run, the default) or are scored each (branch).
    """
    failed_before = {id(s) for s in group if s.status == Status.FAILED}
    branch_of: dict[int, int] = {}  # position in the group of an agent run's extra branch -> of the run's sample
    finished_before = {id(s) for s in group if s.status in FINISHED}
    if ctx.hooks.group_generate:
        # A group-level function sees the whole group, finished samples included, and continues what it must.
        await _generate_group(ctx, group, params)
    else:
        todo = [s for s in group if s.status not in FINISHED]
        results = await asyncio.gather(*(ctx.hooks.generate_sample(ctx, s, params) for s in todo))
        generated = {id(s): out for s, out in zip(todo, results, strict=True)}
        group[:] = [x for s in group for x in generated.get(id(s), [s])]

    for sample in group:
        if sample.status == Status.PENDING:
            sample.status = Status.COMPLETED  # a custom function that set no status finished normally
        if sample.status == Status.FAILED and id(sample) not in failed_before and "generate_error" in sample.metadata:
            ctx.count("generate_failed")
    if ctx.hooks.sample_hooks:  # on what this call generated, before it is scored (as slime's generate_and_rm)
        group[:] = [s if id(s) in finished_before else await _hooked(ctx, s) for s in group]
    if any(s.status == Status.ABORTED for s in group):
        return False
    if not ctx.hooks.keeps_generated_rewards and getattr(ctx.args, "openai_branch_reward", "run") == "run":
        branch_of = run_branches(group)
    keep_set = ctx.hooks.keeps_generated_rewards and not ctx.args.group_rm
    scored = [s for i, s in enumerate(group) if i not in branch_of]
    await ctx.hooks.reward.score_group(ctx.args, scored, ctx.count, keep_set=keep_set)
    for i, run in branch_of.items():
        group[i].reward = group[run].reward
    return True
