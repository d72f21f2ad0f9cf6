"""Example --rollout-function-path: replace the whole rollout (here: no over-sampling, no dynamic filter).

    --rollout-function-path plugins.rollout_function.rollout

It reuses the configured generate and reward functions through `rollout.group.run_group`, so only the
orchestration changes. Counters added with `ctx.count` appear as `rollout/<name>` in the metrics.
"""

from __future__ import annotations

import asyncio

from buffer.buffer import Buffer
from rollout.context import RolloutContext
from rollout.generate import sampling_params_from_args
from rollout.group import run_group
from slime_like.core.sample import Sample


async def rollout(ctx: RolloutContext, rollout_id: int, buffer: Buffer) -> list[list[Sample]]:
    """Take --rollout-batch-size groups from the buffer, generate and score them all, return them."""
    groups = buffer.get_groups(ctx.args.rollout_batch_size)
    params = sampling_params_from_args(ctx.args)
    await asyncio.gather(*(run_group(ctx, group, params) for group in groups))
    ctx.count("custom_rollout_groups", len(groups))
    return groups
