"""The one contract the rollout calls (rollout/hooks.py RolloutHooks' derived fields), made once from hooks of
either contract: the core never asks which contract a hook follows."""

from __future__ import annotations

import asyncio
from argparse import Namespace
from typing import Any

import pytest

from rollout.context import RolloutContext
from rollout.hooks import GENERATE_FLAG, RolloutHooks
from rollout.slime_contract import generate_hook
from slime_like.core.sample import Sample


def _hooks(**kw: Any) -> RolloutHooks:
    return RolloutHooks(**{"generate": None, "group_generate": False, "reward": None, "buffer_filter": None, **kw})


def _ctx(hooks: RolloutHooks) -> RolloutContext:
    return RolloutContext(Namespace(), None, "", None, None, hooks=hooks)  # type: ignore[arg-type]


def test_generate_of_either_contract_returns_the_samples_it_made() -> None:
    async def ours(ctx: Any, sample: Sample, params: dict[str, Any]) -> Sample:
        sample.response = "ours"
        return sample

    async def slimes(args: Any, sample: Sample, params: dict[str, Any]) -> list[Sample]:
        return [sample, Sample(index=7)]  # slime's may fan one sample out

    async def wrong(ctx: Any, sample: Sample, params: dict[str, Any]) -> Sample:
        return Sample()

    native = _hooks(generate=ours)
    sample = Sample(index=1)
    assert asyncio.run(native.generate_sample(_ctx(native), sample, {})) == [sample] and sample.response == "ours"
    assert not native.keeps_generated_rewards
    slime = _hooks(generate=generate_hook(slimes), contracts={GENERATE_FLAG: "slime"})
    out = asyncio.run(slime.generate_sample(_ctx(slime), sample, {}))
    assert [s.index for s in out] == [1, 7] and slime.keeps_generated_rewards
    bad = _hooks(generate=wrong)
    with pytest.raises(TypeError, match="must return the Sample it was given"):
        asyncio.run(bad.generate_sample(_ctx(bad), sample, {}))


def test_unset_hooks_have_no_call() -> None:
    hooks = _hooks()
    assert hooks.generate_sample is None
    assert hooks.filter_samples is hooks.process_all_samples is hooks.post_process_rewards is None
