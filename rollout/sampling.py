"""One rollout with over-sampling and dynamic sampling; what is left at the end is aborted and returned to the buffer.

Groups are started `--over-sampling-batch-size` at a time while kept + running groups are fewer than
`--rollout-batch-size`; each finished group passes the dynamic filter or is dropped (counted by reason). Once
enough groups are kept, requests still running are aborted on every server; those groups (and finished ones
beyond the batch) go back to the buffer: as they are with `--partial-rollout`, else reset to their prompt.

Every group drawn is accounted for (buffer/accounting.py): drawn = trained + failed + dropped + returned, checked
at the end of each rollout (AccountingError when not) and reported as `rollout/groups_*`. When the rollout
raises, every group it still holds goes back to the buffer first.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from buffer.buffer import Buffer
from rollout.abort import abort_and_drain
from rollout.context import RolloutContext, RolloutRecord
from rollout.filters import apply_dynamic_filter
from rollout.group import run_group
from slime_like.core.sample import Sample, Status

logger = logging.getLogger(__name__)

# A filter that drops (almost) everything would loop forever over the data: stop with an error instead.
MAX_DROPPED_PER_KEPT = 50


def return_to_buffer(ctx: RolloutContext, buffer: Buffer, groups: list[list[Sample]], origin: dict[int, Any]) -> None:
    """Hand unused groups back: partially generated ones continue later (--partial-rollout), others restart."""
    args = ctx.args
    for group in groups:
        if not args.partial_rollout:  # the group starts again from what was served: an agent's extra branches go
            group[:] = [s for s in group if id(s) in origin]
        for sample in group:
            if not args.partial_rollout:
                sample.reset(origin[id(sample)])
                continue
            sample.metadata["partial_rollouts"] = sample.metadata.get("partial_rollouts", 0) + 1
            if sample.status == Status.ABORTED:
                ctx.count("samples_partial")
            if args.mask_offpolicy_in_partial_rollout and sample.response_length:
                # These tokens came from weights older than those that will continue the sample.
                sample.loss_mask = [0] * sample.response_length
    buffer.add_groups(groups)  # the buffer's ledger counts them as returned


async def generate_rollout(ctx: RolloutContext, buffer: Buffer, params: dict[str, Any]) -> list[list[Sample]]:
    """Exactly `--rollout-batch-size` groups that passed the dynamic filter, ordered by group index."""
    args, hooks = ctx.args, ctx.hooks
    target, batch = args.rollout_batch_size, args.over_sampling_batch_size
    kept: list[list[Sample]] = []
    unused: list[list[Sample]] = []
    running: dict[asyncio.Task[bool], list[Sample]] = {}
    origin: dict[int, dict[str, Any]] = {}  # metadata as served, to reset a sample returned without its tokens
    dropped = 0
    ledger = ctx.accounting = buffer.open_ledger()
    ctx.record = record = RolloutRecord(buffer)
    try:
        while len(kept) < target:
            while len(kept) + len(running) < target:
                groups = buffer.get_groups(batch)
                ctx.count("groups_started", len(groups))
                for group in groups:
                    origin.update({id(s): dict(s.metadata) for s in group})
                    running[asyncio.create_task(run_group(ctx, group, params))] = group
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                # The result first: a task that raised stays in `running`, so its group goes back to the buffer.
                finished = task.result()
                group = running.pop(task)
                if not finished or len(kept) >= target:
                    unused.append(group)
                    ctx.count("groups_surplus" if finished else "groups_aborted")
                    continue
                ctx.count("groups_generated")
                record.generated.append(group)
                verdict = apply_dynamic_filter(hooks.dynamic_filter, args, group)
                if verdict.keep or (verdict.keep_when_insufficient and len(kept) + len(running) < target):
                    kept.append(group)
                    continue
                dropped += 1
                ledger.drop(group, verdict.reason or "filtered")
                if dropped > MAX_DROPPED_PER_KEPT * target:
                    raise RuntimeError(
                        f"dynamic sampling dropped {dropped} groups and kept {len(kept)} of {target}: "
                        f"check --dynamic-sampling-filter-path (last reason: {verdict.reason})"
                    )
    except BaseException:
        unused.extend(kept)  # the rollout is lost, its groups are not: they run again in the next one
        raise
    finally:
        # On success and on error alike: nothing of this rollout may keep running on the servers.
        try:
            if running:
                await abort_and_drain(ctx, list(running))
                for task, group in running.items():
                    if task.cancelled() or task.exception() is not None or not task.result():
                        ctx.count("groups_aborted")
                    else:
                        ctx.count("groups_surplus")
                    unused.append(group)
            if unused:
                return_to_buffer(ctx, buffer, unused, origin)
        finally:
            buffer.close_ledger()
    ledger.keep(kept)
    for key, n in ledger.check().items():
        ctx.count(key, n)
    ctx.count("groups_kept", len(kept))
    return sorted(kept, key=lambda g: (g[0].group_index is None, g[0].group_index or 0))
