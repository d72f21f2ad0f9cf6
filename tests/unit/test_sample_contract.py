"""One Sample contract in core; slime's Sample (its extra fields and helpers) is a subclass the plugin loader switches
to when a slime plugin is loaded, and slime's `remove_sample` is translated at the edge (rollout/slime_contract.py)."""

from __future__ import annotations

import asyncio
import json
import sys
from argparse import Namespace
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import pytest

from buffer.data_source import DataSource, PromptDataset
from buffer.train_data import build_train_data
from rollout import slime_contract
from rollout.context import RolloutContext
from rollout.hooks import RolloutHooks
from rollout.postprocess import finish_rollout
from slime_like.core import slime_finder
from slime_like.core.plugin_loader import load_hook
from slime_like.core.sample import Sample, Status, sample_type

slime_finder.install()
from slime.utils.types import Sample as SlimeSample  # noqa: E402

SLIME_ONLY = {
    "rollout_id", "remove_sample", "weight_versions", "multimodal_train_input_id", "apply_chat_template_kwargs",
    "rollout_top_p_token_ids",
    "rollout_top_p_token_offsets", "generate_function_path", "custom_rm_path", "train_metadata", "session_id",
    "non_generation_time", "spec_info", "prefix_cache_info",
}  # fmt: skip
# A slime generate function: appends with slime's helper and removes odd samples from the loss.
PLUGIN = """
from slime.utils.types import Sample


async def generate(args, sample: Sample, sampling_params) -> Sample:
    sample.tokens = sample.tokens or [1, 2]
    meta = {"finish_reason": {"type": "stop"}, "weight_version": "3"}
    sample.append_response_tokens(tokens=[7, 8], log_probs=[-0.5, -0.5], meta_info=meta)
    sample.reward = float(sample.index)
    sample.remove_sample = sample.index % 2 == 1
    return sample
"""


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path for the plugin modules a test writes (forgotten afterwards)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("plug_contract", None)


def test_core_sample_has_no_slime_field_or_helper() -> None:
    ours = {f.name for f in fields(Sample)}
    assert not ours & SLIME_ONLY and {f.name for f in fields(SlimeSample)} == ours | SLIME_ONLY
    assert {"teacher_log_probs", "rollout_routed_experts", "version_spans"} <= ours  # OPD and R3 are ours
    for helper in ("Status", "SpecInfo", "PrefixCacheInfo", "append_response_tokens", "get_reward_value"):
        assert not hasattr(Sample, helper) and hasattr(SlimeSample, helper)
    assert issubclass(SlimeSample, Sample) and SlimeSample.Status is Status


def test_a_slime_plugin_gets_slime_samples_and_remove_sample_masks(plugin_dir: Path) -> None:
    (plugin_dir / "prompts.jsonl").write_text(
        "".join(json.dumps({"prompt": f"q{i}", "label": str(i)}) + "\n" for i in range(2))
    )
    source = DataSource(PromptDataset(plugin_dir / "prompts.jsonl"), 2, shuffle=False)
    assert type(source.get_groups(1)[0][0]) is Sample  # no slime plugin yet: ours
    (plugin_dir / "plug_contract.py").write_text(PLUGIN)
    fn, contract = load_hook("plug_contract.generate", "--custom-generate-function-path", "auto", (3, True), (3, True))
    assert contract == "slime" and sample_type() is SlimeSample
    group = source.get_groups(1)[0]
    assert all(type(s) is SlimeSample for s in group)
    assert type(sample_type().from_dict(group[0].to_dict())) is SlimeSample  # buffer state, debug replay

    contracts = {"--custom-generate-function-path": "slime"}
    generate = slime_contract.generate_hook(fn)
    hooks = RolloutHooks(generate, False, None, None, contracts=contracts)  # type: ignore[arg-type]
    ctx = RolloutContext(Namespace(reward_key=None), None, "", None, None, hooks=hooks)  # type: ignore[arg-type]

    async def generate_all() -> list[list[SlimeSample]]:
        return [[s for sample in group for s in await hooks.generate_sample(ctx, sample, {})]]

    groups = asyncio.run(generate_all())
    finish_rollout(ctx, groups)
    assert [s.loss_mask for s in groups[0]] == [[1, 1], [0, 0]] and ctx.counters["samples_excluded_from_loss"] == 1
    assert groups[0][1].metadata["excluded_from_loss"] and not groups[0][0].metadata.get("excluded_from_loss")
    data = build_train_data(groups)  # the removed sample still counts in its group's statistics
    assert data.group_ids == [0, 0] and data.raw_rewards == [2.0, 3.0] and data.loss_masks == [[1, 1], [0, 0]]
    removed = groups[0][1]
    assert removed.remove_sample and removed.weight_versions == ["3"]
    removed.reset({})  # back to the buffer without its tokens: slime's per-generation fields too
    assert not removed.remove_sample and removed.weight_versions == [] and removed.loss_mask is None


def test_with_the_real_slime_installed_samples_still_carry_slime_s_fields(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `slime` package on sys.path (the real one, to Python) wins over our stand-in: samples are then our
    compatibility Sample loaded under its own name, with slime's fields and helpers, as before the split."""
    from slime_like.core.plugin_loader import use_slime_samples

    (tmp_path / "slime" / "utils").mkdir(parents=True)
    (tmp_path / "slime" / "__init__.py").write_text("")
    (tmp_path / "slime" / "utils" / "__init__.py").write_text("")
    (tmp_path / "slime" / "utils" / "types.py").write_text("class Sample:\n    pass\n")
    for name in [m for m in sys.modules if m == "slime" or m.startswith(("slime.", "slime_like.compat"))]:
        monkeypatch.delitem(sys.modules, name)  # put back after the test
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        use_slime_samples()
        made = sample_type()
        assert not slime_finder.is_compat() and made.__module__ == "slime_like.compat.slime.utils.types"
        assert issubclass(made, Sample) and made(index=0).remove_sample is False
        assert callable(made.append_response_tokens) and made.Status is Status
    finally:  # the fake slime and the second copy go; monkeypatch puts the modules from before back
        for name in [m for m in sys.modules if m == "slime" or m.startswith(("slime.", "slime_like.compat"))]:
            del sys.modules[name]
