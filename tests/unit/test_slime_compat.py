"""Plugins written for slime: the `slime` finder, the contract rule, Sample's slime helpers and the adapters."""

from __future__ import annotations

import asyncio
import importlib
import importlib.machinery
import json
import logging
import sys
from argparse import Namespace
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from buffer.buffer import Buffer
from buffer.data_source import DataSource, PromptDataset
from buffer.train_data import build_train_data
from rollout import slime_contract
from rollout.context import RolloutContext
from rollout.filters import apply_dynamic_filter
from rollout.hooks import RolloutHooks
from rollout.postprocess import finish_rollout
from slime_like.core import slime_finder
from slime_like.core.errors import PluginError
from slime_like.core.plugin_loader import load_hook, plugin_contract
from slime_like.core.sample import Sample as CoreSample
from slime_like.core.sample import Status
from slime_like.trainer.algorithms.advantages import AdvantageInputs, compute_advantages
from slime_like.trainer.algorithms.grpo import grpo_advantages

slime_finder.install()  # as the plugin loader does: `import slime` finds our package (no real slime here)
from slime.utils.types import Sample  # noqa: E402  (slime's Sample: ours with slime's fields and helpers)


@pytest.fixture
def no_slime(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No `slime` module imported; whatever was imported before comes back after the test."""
    saved = {k: v for k, v in sys.modules.items() if k == "slime" or k.startswith("slime.")}
    for name in saved:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [k for k in sys.modules if k == "slime" or k.startswith("slime.")]:
        del sys.modules[name]
    sys.modules.update(saved)


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder on sys.path for the plugin modules a test writes (forgotten afterwards)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [k for k in sys.modules if k.startswith("plug_")]:
        del sys.modules[name]


def test_without_real_slime_ours_is_imported_once(no_slime: None) -> None:
    slime_finder.install()
    slime_finder.install()
    assert sum(isinstance(f, slime_finder.SlimeCompatFinder) for f in sys.meta_path) == 1
    ours = next(i for i, f in enumerate(sys.meta_path) if isinstance(f, slime_finder.SlimeCompatFinder))
    assert ours > sys.meta_path.index(importlib.machinery.PathFinder)  # the normal path finder looks first
    types = importlib.import_module("slime.utils.types")
    assert slime_finder.is_compat() and issubclass(types.Sample, CoreSample) and types.Sample.Status is Status
    filters = importlib.import_module("slime.rollout.filter_hub.dynamic_sampling_filters")
    assert filters.check_reward_nonzero_std.__module__ == "slime.rollout.filter_hub.dynamic_sampling_filters"
    assert not any(k.startswith("slime_like.compat.slime") for k in sys.modules)  # one copy, named slime.*


def test_a_real_slime_on_the_path_wins(no_slime: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "slime" / "utils").mkdir(parents=True)
    (tmp_path / "slime" / "__init__.py").write_text("REAL = True\n")
    (tmp_path / "slime" / "utils" / "__init__.py").write_text("")
    (tmp_path / "slime" / "utils" / "types.py").write_text("class Sample:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    slime_finder.install()
    slime = importlib.import_module("slime")
    assert slime.REAL and not slime_finder.is_compat()
    assert not issubclass(importlib.import_module("slime.utils.types").Sample, CoreSample)
    with pytest.raises(ModuleNotFoundError):  # nothing of ours is mixed into the real package
        importlib.import_module("slime.rollout.sglang_rollout")


NATIVE = "async def generate(ctx, sample, params):\n    return sample\n"
SLIME_FROM = "from slime.utils.types import Sample\n\n\ndef keep(args, rollout_id, buffer, n):\n    return buffer[:n]\n"
SLIME_LAZY = "def keep(args, rollout_id, buffer, n):\n    import slime.utils.misc\n    return buffer[:n]\n"


def test_the_contract_rule(plugin_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    (plugin_dir / "plug_native.py").write_text(NATIVE)
    (plugin_dir / "plug_slime.py").write_text(SLIME_FROM)
    (plugin_dir / "plug_lazy.py").write_text(SLIME_LAZY)
    (plugin_dir / "plug_reexport.py").write_text("from plug_slime import keep\n")
    caplog.set_level(logging.INFO, "slime_like.core.plugin_loader")
    native, contract = load_hook(
        "plug_native.generate", "--custom-generate-function-path", "auto", (3, True), (3, True)
    )
    assert contract == "native"
    keep, contract = load_hook("plug_slime.keep", "--buffer-filter-path", "auto", (3, False), (4, False))
    assert contract == "slime"
    assert (
        "--buffer-filter-path=plug_slime.keep follows the slime plugin contract: its module plug_slime imports slime"
        in caplog.text
    )
    # The import statement decides (the module's globals also hold slime's Sample, defined in slime.utils.types).
    assert plugin_contract(keep) == ("slime", "its module plug_slime imports slime")
    assert plugin_contract(importlib.import_module("plug_lazy").keep)[0] == "slime"  # an import inside a function
    assert plugin_contract(importlib.import_module("plug_reexport").keep)[0] == "slime"  # its defining module decides
    builtin = importlib.import_module("slime.rollout.filter_hub.dynamic_sampling_filters").check_reward_nonzero_std
    assert plugin_contract(builtin) == ("slime", "it is defined in slime.rollout.filter_hub.dynamic_sampling_filters")
    assert plugin_contract(native) == ("native", "its module plug_native does not import slime")
    assert plugin_contract(keep, "native") == ("native", "--plugin-api native")
    assert plugin_contract(native, "slime") == ("slime", "--plugin-api slime")
    # Each contract checks its own signature, and says which one failed.
    with pytest.raises(PluginError, match=r"must accept 3 positional argument\(s\), its signature"):
        load_hook("plug_slime.keep", "--buffer-filter-path", "native", (3, False), (4, False))
    with pytest.raises(PluginError, match=r"must be a plain function \(not async\) \(slime's contract"):
        load_hook("plug_native.generate", "--rollout-function-path", "slime", (3, True), (3, False))


def test_sample_speaks_slime() -> None:
    s = Sample("q", [1, 2], index=3, label="7")  # our positional order is unchanged
    assert s.prompt == "q" and s.Status.ABORTED is Status.ABORTED and not s.remove_sample
    s.append_response_tokens(tokens=torch.tensor([5, 6]), log_probs=[-0.1, -0.2], text="ab")
    s.append_response_tokens(tokens=[7], trainable=False, text="c")
    meta = {"finish_reason": {"type": "length"}, "weight_version": "4", "cached_tokens": 2, "prompt_tokens": 4}
    s.append_response_tokens(tokens=[8], log_probs=[-0.3], meta_info=meta, text="d")
    assert (s.tokens, s.response, s.response_length) == ([1, 2, 5, 6, 7, 8], "abcd", 4)
    assert s.loss_mask == [1, 1, 0, 1] and s.rollout_log_probs == [-0.1, -0.2, 0.0, -0.3]
    assert s.status == Status.TRUNCATED and s.weight_versions == ["4"] and s.weight_version == 4
    assert s.effective_response_length == 3 and s.prefix_cache_info.prefix_cache_hit_rate == 0.5
    with pytest.raises(ValueError, match="need their log_probs"):
        s.append_response_tokens(tokens=[9])
    with pytest.raises(ValueError, match="take no log_probs"):
        s.append_response_tokens(tokens=[9], log_probs=[-0.5], trainable=False)
    # zeros, the values they get anyway, as slime's geo3k_vlm_multi_turn rollout passes them for the environment's
    s.append_response_tokens(tokens=[9], log_probs=[0.0], trainable=False)
    assert s.loss_mask[-1] == 0 and s.rollout_log_probs[-1] == 0.0 and s.tokens[-1] == 9
    s.reward = {"score": 1.0, "pred": "7"}
    assert s.get_reward_value(Namespace(reward_key="score")) == 1.0
    s.custom_attribute = [1]  # slime keeps attributes set on a sample through to_dict/from_dict
    back = Sample.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back == s and back.custom_attribute == [1] and back.status is Status.TRUNCATED


def test_append_response_tokens_grows_the_lists_in_place() -> None:
    """slime's multi-turn examples hold `sample.loss_mask` while they append turns: the held lists must grow too."""
    s = Sample("q", [1, 2])
    s.append_response_tokens(tokens=[5], log_probs=[-0.5])
    tokens, mask, log_probs = s.tokens, s.loss_mask, s.rollout_log_probs
    s.append_response_tokens(tokens=[6, 7], trainable=False)
    s.append_response_tokens(tokens=[8], log_probs=[-0.25])
    assert tokens is s.tokens and tokens == [1, 2, 5, 6, 7, 8]
    assert mask is s.loss_mask and mask == [1, 0, 0, 1]
    assert log_probs is s.rollout_log_probs and log_probs == [-0.5, 0.0, 0.0, -0.25]
    t = Sample("q", tuple([1]))
    t.append_response_tokens(tokens=[3], log_probs=[-1.0])
    assert t.tokens == [1, 3]


def test_slime_args_view() -> None:
    args = Namespace(rollout_max_response_len=8, rollout_num_gpus=2, rollout_num_gpus_per_engine=1)
    view = slime_contract.slime_args(args)
    assert slime_contract.slime_args(args) is view and slime_contract.slime_args(view) is view
    view.tokenizer = "mine"  # a plugin's own state stays in the view
    assert view.tokenizer == "mine" and not hasattr(args, "tokenizer")
    assert view.rollout_max_response_len == 8 and view.rollout_max_context_len is None and view.rollout_num_engines == 2
    with pytest.raises(AttributeError, match="no such flag"):
        _ = view.no_such_flag


def groups_of(*rewards: list[float]) -> list[list[Sample]]:
    return [
        [Sample(tokens=[1, 2], response_length=1, reward=r, group_index=g, index=2 * g + i, status=Status.COMPLETED)
         for i, r in enumerate(rs)]
        for g, rs in enumerate(rewards)
    ]  # fmt: skip


def test_filter_adapters(tmp_path: Path) -> None:
    base_types = importlib.import_module("slime.rollout.filter_hub.base_types")
    filters = importlib.import_module("slime.rollout.filter_hub.dynamic_sampling_filters")
    args = Namespace(reward_key=None)
    zero, varied = groups_of([1.0, 1.0], [1.0, 0.0])
    drop = slime_contract.dynamic_filter_hook(filters.check_reward_nonzero_std)
    assert (
        apply_dynamic_filter(drop, args, zero).reason == "zero_std_1.0"
        and apply_dynamic_filter(drop, args, varied).keep
    )
    fallback = slime_contract.dynamic_filter_hook(filters.check_reward_nonzero_std_with_fallback)(args, zero)
    assert not fallback.keep and fallback.keep_when_insufficient
    as_bool = slime_contract.dynamic_filter_hook(lambda a, g: torch.tensor(False))  # a 0-dim tensor, as slime's
    assert as_bool(args, zero).reason == "<lambda>"
    assert base_types.call_dynamic_filter(None, args, zero).keep

    def last_first(args: Any, rollout_id: Any, buffer: list[list[Sample]], n: int) -> list[list[Sample]]:
        assert rollout_id is None
        return [buffer.pop() for _ in range(min(n, len(buffer)))]

    source = DataSource(PromptDataset(_prompts(tmp_path / "prompts.jsonl")), 1, shuffle=False)
    buf = Buffer(source, slime_contract.buffer_filter_hook(last_first))
    buf.add_groups(buf.get_groups(3))
    assert [g[0].prompt for g in buf.get_groups(2)] == ["q2", "q1"] and len(buf) == 1


def _prompts(path: Path) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"q{i}", "label": str(i)}) + "\n" for i in range(5)))
    return path


def hooks_ctx(**hooks: Any) -> RolloutContext:
    full = dict(generate=None, group_generate=False, reward=None, buffer_filter=None, **hooks)
    return RolloutContext(Namespace(reward_key="score"), None, "", None, None, hooks=RolloutHooks(**full))  # type: ignore[arg-type]


def test_slime_sample_filter_remove_sample_and_post_process_replace_normalisation() -> None:
    def remove_second(args: Any, data: list[list[Sample]]) -> None:
        for group in data:
            group[1].remove_sample = True

    def centre(args: Any, samples: list[Sample]) -> tuple[list[float], list[float]]:
        raw = [s.get_reward_value(args) for s in samples]
        return raw, [r - 0.5 for r in raw]

    contracts = {"--rollout-sample-filter-path": "slime", "--custom-reward-post-process-path": "slime"}
    ctx = hooks_ctx(sample_filter=remove_second, reward_post_process=centre, contracts=contracts)
    groups = groups_of([{"score": 1.0, "pred": "a"}, {"score": 0.0, "pred": None}])
    finish_rollout(ctx, groups)
    assert [s.loss_mask for s in groups[0]] == [None, [0]] and ctx.counters["samples_excluded_from_loss"] == 1
    assert [(s.reward, s.metadata["raw_reward"]) for s in groups[0]] == [(0.5, 1.0), (-0.5, 0.0)]
    data = build_train_data(groups, reward_key="score")
    assert data.reward_normalized == [True, True] and data.raw_rewards == [0.5, -0.5]
    # The trainer then takes the rewards as they are (grpo would normalise them again).
    masks = [torch.ones(1), torch.ones(1)]
    inputs = AdvantageInputs(data.raw_rewards, data.group_ids, masks, [torch.zeros(1)] * 2, rewards_normalized=True)
    args = Namespace(advantage_estimator="grpo", disable_grpo_std_normalization=False, normalize_advantages=False)
    assert [a.item() for a in compute_advantages(args, inputs).advantages] == [0.5, -0.5]
    inputs.rewards_normalized = False
    normalised = grpo_advantages(data.raw_rewards, data.group_ids)
    assert [a.item() for a in compute_advantages(args, inputs).advantages] == pytest.approx(normalised)
    assert normalised[0] != 0.5


def test_reward_check_and_rollout_outputs() -> None:
    assert slime_contract.check_reward({"score": 1, "pred": "x", "trace": [1]}, "score") == {
        "score": 1,
        "pred": "x",
        "trace": [1],
    }
    assert slime_contract.check_reward(True, None) == 1.0
    with pytest.raises(ValueError):
        slime_contract.check_reward({"score": "high"}, "score")
    with pytest.raises(TypeError):
        slime_contract.check_reward("1.0", None)
    base_types = importlib.import_module("slime.rollout.base_types")
    a, b, c = (Sample(group_index=g, index=i) for g, i in ((0, 0), (0, 1), (1, 2)))
    assert slime_contract._groups([[a, [b, c]]]) == [[a, b, c]]  # nested fan-out lists flatten into their group
    assert slime_contract._groups([a, b, c]) == [[a, b], [c]]  # a flat list is grouped by group_index
    out = base_types.call_rollout_fn(lambda args, rid, ds, evaluation: [[a]], None, 0, None, evaluation=False)
    assert isinstance(out, base_types.RolloutFnTrainOutput) and out.samples == [[a]]


def test_slime_eval_function_runs_in_a_thread() -> None:
    base_types = importlib.import_module("slime.rollout.base_types")
    seen: dict[str, Any] = {}

    def evaluate(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
        seen.update(evaluation=evaluation, router=(args.sglang_router_ip, args.sglang_router_port))
        data = {"gsm": {"rewards": [1, 0, 1, 1], "truncated": [False, True, False, False], "samples": [None] * 4}}
        return base_types.RolloutFnEvalOutput(data=data, metrics={"extra": 3})

    async def main() -> dict[str, Any]:
        ctx = RolloutContext(Namespace(), None, "http://127.0.0.1:4321", None, None)  # type: ignore[arg-type]
        from rollout.context import running

        with running(ctx):
            return await slime_contract.eval_function_hook(evaluate)(ctx, 0, {})

    metrics = asyncio.run(main())
    assert seen == {"evaluation": True, "router": ("127.0.0.1", 4321)}
    assert metrics == {
        "eval/gsm/reward_mean": 0.75,
        "eval/gsm/num_samples": 4,
        "eval/gsm/truncated_rate": 0.25,
        "eval/extra": 3,
    }


def test_slime_data_source_serves_groups_and_resumes(base: list[str], tmp_path: Path) -> None:
    from rollout.hooks import load_hooks
    from slime_like.arguments import parse_args

    data = _prompts(tmp_path / "train.jsonl")
    flags = [
        *base,
        "--prompt-data",
        str(data),
        "--input-key",
        "prompt",
        "--label-key",
        "label",
        "--data-source-path",
        "slime.rollout.data_source.RolloutDataSourceWithBuffer",
    ]
    hooks = load_hooks(parse_args(flags))
    assert hooks.contracts["--data-source-path"] == "slime"
    source = hooks.data_source_factory(parse_args(flags), None)
    first = source.get_groups(2)
    assert [[s.prompt for s in g] for g in first] == [["q0", "q0"], ["q1", "q1"]] and len(source) == 5
    state = source.state_dict()
    again = hooks.data_source_factory(parse_args(flags), None)
    again.load_state_dict(json.loads(json.dumps(state)))
    assert again.get_groups(1)[0][0].prompt == "q2"
