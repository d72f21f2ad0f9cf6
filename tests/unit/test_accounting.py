"""Per-rollout group accounting: drawn = trained + failed + dropped + returned, on the real rollout loop
(rollout/sampling.py) over a real Buffer, DataSource, reward and dynamic filter; the generate plugin stands in
for SGLang (a plugin is the extension point; the loop, buffer, scoring and filtering are the real ones)."""

from __future__ import annotations

import asyncio
import json
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest

from buffer.accounting import AccountingError, GroupLedger, all_failed, failure_reason
from buffer.buffer import Buffer
from buffer.data_source import DataSource, PromptDataset
from rollout.context import RolloutContext
from rollout.hooks import RolloutHooks
from rollout.postprocess import finish_rollout
from rollout.rewards import RewardFunction
from rollout.sampling import generate_rollout
from slime_like.core.sample import Sample, Status

N = 2  # samples per prompt


@pytest.fixture
def buffer(tmp_path: Path) -> Buffer:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"q{i}", "label": str(i)}) + "\n" for i in range(20)))
    return Buffer(DataSource(PromptDataset(path), N, shuffle=False))


class Plan:
    """What the stand-in generate function does per group index: finish after a delay, fail, hang, or raise."""

    def __init__(self, **per_group: Any) -> None:
        self.per_group = per_group
        self.attempts: dict[int, int] = {}

    async def generate(self, ctx: RolloutContext, sample: Sample, params: dict[str, Any]) -> Sample:
        """Stands in for SGLang: two response tokens, unless the plan says otherwise for this group."""
        self.attempts[sample.index] = self.attempts.get(sample.index, 0) + 1
        action = self.per_group.get(f"g{sample.group_index}", 0.0)
        if action == "hang" and self.attempts[sample.index] == 1:  # runs until the rollout aborts it
            while not ctx.aborting:
                await asyncio.sleep(0.01)
            sample.status = Status.ABORTED
            return sample
        if action == "raise":
            await asyncio.sleep(0.1)
            raise TypeError("a generate plugin bug")
        await asyncio.sleep(action if isinstance(action, float) else 0.0)
        if action == "fail":
            sample.status = Status.FAILED
            sample.metadata["generate_error"] = "engine said no"
            return sample
        sample.tokens, sample.response_length, sample.loss_mask = [1, 2, 3, 4], 2, [1, 1]
        sample.status = Status.COMPLETED
        return sample


def not_group_0(args: Any, group: list[Sample]) -> bool:
    """A dynamic filter: drops group 0 (reported under this function's name)."""
    return group[0].group_index != 0


def context(plan: Plan, partial: bool = False) -> RolloutContext:
    args = Namespace(
        rollout_batch_size=2, over_sampling_batch_size=4, partial_rollout=partial,
        mask_offpolicy_in_partial_rollout=False, reward_key=None, group_rm=False,
    )  # fmt: skip
    hooks = RolloutHooks(
        generate=plan.generate,
        group_generate=False,
        reward=RewardFunction(lambda _a, s: float(s.index % 2), inline=True),  # 0/1 within every group
        buffer_filter=None,  # type: ignore[arg-type]
        dynamic_filter=not_group_0,
    )
    return RolloutContext(args, None, "", None, None, hooks=hooks)  # type: ignore[arg-type]


def balanced(c: dict[str, int]) -> bool:
    return c["groups_drawn"] == c["groups_trained"] + c["groups_failed"] + c["groups_dropped"] + c["groups_returned"]


def test_every_group_drawn_is_trained_failed_dropped_or_returned(buffer: Buffer) -> None:
    # Group 0 is dropped by the filter, 1 fails in generation, 2 trains, 3 is still running when the batch is
    # full: aborted and returned. Delays order the groups' ends.
    plan = Plan(g0=0.0, g1="fail", g2=0.2, g3="hang")
    ctx = context(plan)
    groups = asyncio.run(generate_rollout(ctx, buffer, {}))
    assert [g[0].group_index for g in groups] == [1, 2]
    c = ctx.counters
    assert (c["groups_drawn"], c["groups_drawn_source"], c["groups_drawn_buffer"]) == (4, 4, 0)
    assert (c["groups_trained"], c["groups_failed"], c["groups_failed_generate"]) == (1, 1, 1)
    assert (c["groups_dropped"], c["groups_dropped_not_group_0"], c["groups_returned"]) == (1, 1, 1)
    assert balanced(c) and c["groups_kept"] == 2 and "groups_unaccounted" not in c
    assert [g[0].group_index for g in buffer.returned_groups()] == [3]
    finish_rollout(ctx, groups)  # the built-in loop accounted for them: nothing counted twice
    assert c["groups_trained"] == 1

    # The next rollout draws the returned group first (it finishes now), then fresh ones.
    ctx = context(plan)
    groups = asyncio.run(generate_rollout(ctx, buffer, {}))
    c = ctx.counters
    assert (c["groups_drawn_buffer"], c["groups_drawn_source"]) == (1, 3) and balanced(c)
    assert len(groups) == c["groups_trained"] == 2
    assert c["groups_returned"] == len(buffer) == 2  # the fresh groups beyond the batch wait, none is lost


def test_partial_rollout_returns_aborted_groups_with_their_tokens(buffer: Buffer) -> None:
    ctx = context(Plan(g0=0.0, g1=0.1, g2=0.2, g3="hang"), partial=True)
    asyncio.run(generate_rollout(ctx, buffer, {}))
    assert balanced(ctx.counters) and ctx.counters["groups_returned"] == 1
    (waiting,) = buffer.returned_groups()
    assert all(s.status == Status.ABORTED and s.metadata["partial_rollouts"] == 1 for s in waiting)


def test_a_rollout_that_raises_hands_every_group_back(buffer: Buffer) -> None:
    # Group 2's generate function raises: the rollout fails, and every group it held goes back to the buffer
    # (kept, raised, still running); only the group the filter dropped is gone, as it would be anyway.
    ctx = context(Plan(g0=0.0, g1=0.05, g2="raise", g3="hang"))
    with pytest.raises(TypeError, match="a generate plugin bug"):
        asyncio.run(generate_rollout(ctx, buffer, {}))
    waiting = buffer.returned_groups()
    assert sorted(g[0].group_index for g in waiting) == [1, 2, 3]
    assert all(s.status == Status.PENDING and not s.tokens for g in waiting for s in g)  # reset to the prompt
    buffer.open_ledger()  # the failed rollout's ledger was closed: the next rollout can open one
    buffer.close_ledger()


def test_the_ledger_raises_when_a_group_is_lost_or_counted_twice(buffer: Buffer) -> None:
    ledger = buffer.open_ledger()
    a, b, c = buffer.get_groups(3)
    for sample in b + c:
        sample.status, sample.response_length = Status.COMPLETED, 1
    buffer.add_groups([a])
    ledger.keep([b])
    with pytest.raises(AccountingError, match=r"drawn 3 .* trained 1 \+ failed 0 \+ dropped 0 \+ returned 1.*#2"):
        ledger.check()  # group #2 went nowhere
    ledger.keep([c, c])
    with pytest.raises(AccountingError, match="group #2 trained but it was already trained"):
        ledger.check()
    buffer.close_ledger()

    other = GroupLedger()
    other.keep([[Sample(index=7, status=Status.COMPLETED, response_length=1)]])
    with pytest.raises(AccountingError, match=r"\(sample 7\) trained but never drawn"):
        other.check()


def test_failure_reasons() -> None:
    def s(status: Status, length: int = 2, **meta: Any) -> Sample:
        return Sample(status=status, response_length=length, metadata=meta)

    assert failure_reason([s(Status.FAILED, generate_error="x"), s(Status.COMPLETED)]) is None
    assert failure_reason([s(Status.FAILED, generate_error="x")] * 2) == "generate"
    assert failure_reason([s(Status.FAILED, reward_error="x")]) == "reward"
    assert failure_reason([s(Status.TRUNCATED, 0)]) == "empty"
    assert failure_reason([s(Status.ABORTED), s(Status.FAILED, reward_error="x")]) == "mixed"


def test_a_rollout_whose_every_sample_failed_is_described() -> None:
    def failed(**meta: Any) -> Sample:
        return Sample(status=Status.FAILED, response_length=2, metadata=meta)

    down = [[failed(generate_error="connection refused: http://127.0.0.1:1")] * 2 for _ in range(3)]
    rm = [[failed(reward_error="ValueError('no label')")] * 2]
    assert all_failed(down + [[failed(), Sample(status=Status.COMPLETED, response_length=2)]]) is None
    assert all_failed([]) is None
    assert all_failed(down + rm) == (
        "all 8 samples failed (3 groups by generate, 1 groups by reward): 6 x connection refused: "
        "http://127.0.0.1:1; 2 x ValueError('no label')"
    )


def test_custom_rollout_functions_are_counted_and_may_not_repeat_a_group() -> None:
    ctx = context(Plan())
    ok = [Sample(index=0, response_length=1, status=Status.COMPLETED)]
    failed = [Sample(index=1, status=Status.FAILED, metadata={"reward_error": "boom"})]
    finish_rollout(ctx, [ok, failed])
    assert ctx.counters == {"groups_trained": 1, "groups_failed": 1, "groups_failed_reward": 1}
    with pytest.raises(AccountingError, match="--rollout-function-path returned samples \\[0\\] twice"):
        finish_rollout(context(Plan()), [ok, [ok[0]]])


def test_a_filter_that_drops_everything_stops_with_an_error_naming_it(buffer: Buffer) -> None:
    ctx = context(Plan())
    ctx.hooks.dynamic_filter = lambda args, group: False
    with pytest.raises(RuntimeError, match=r"dropped 101 groups and kept 0 of 2: check --dynamic-sampling-filter-path"):
        asyncio.run(generate_rollout(ctx, buffer, {}))
    assert len(buffer) <= 4  # what was still running went back to the buffer; the dropped groups are gone
