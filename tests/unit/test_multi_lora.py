"""Multi-LoRA (--multi-lora-adapter): the flags and adapter configs with errors naming the fix, the per-adapter
prompt source that tags each sample, the requests that name its adapter, and one adapter's share of a rollout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from buffer.lora_share import adapter_names, adapter_share
from buffer.train_data import build_train_data, split_by_dp
from rollout.generate import with_adapter
from rollout.lora_data import multi_lora_source
from slime_like.arguments import parse_args
from slime_like.core.sample import Sample, Status

LORA = ["--lora-rank", "4", "--lora-alpha", "8", "--target-modules", "all-linear"]


@pytest.fixture
def adapters(tmp_path: Path) -> dict[str, Path]:
    """Two adapter configs in miles' adapter.yaml shape, each with its own prompt file (relative paths)."""
    out = {}
    for name, key in (("math", "input"), ("code", "question")):
        rows = [{key: f"{name} {i}", "label": str(i)} for i in range(3)]
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        extra = "" if key == "input" else f"input_key: {key}\n"
        (tmp_path / f"{name}.yaml").write_text(f"data: {name}.jsonl\nrank: 4\n{extra}")
        out[name] = tmp_path / f"{name}.yaml"
    return out


def _flags(base: list[str], adapters: dict[str, Path]) -> list[str]:
    without_prompts = [f for i, f in enumerate(base) if f != "--prompt-data" and base[i - 1] != "--prompt-data"]
    return without_prompts + LORA + [x for n, p in adapters.items() for x in ("--multi-lora-adapter", n, str(p))]


def test_adapters_route_their_prompts_and_requests_name_them(base, adapters, tiny_qwen3) -> None:
    from transformers import AutoTokenizer

    args = parse_args(_flags(base, adapters))
    assert args.lora_adapter_names == ["math", "code"] and args.multi_lora_n_adapters == 2
    assert args.sglang_server_args[args.sglang_server_args.index("--max-loras-per-batch") + 1] == "2"
    source = multi_lora_source(args, AutoTokenizer.from_pretrained(tiny_qwen3))
    groups = source.get_groups(3) + source.get_groups(1)  # the turn carries across calls
    assert [g[0].metadata["lora_adapter"] for g in groups] == ["math", "code", "math", "code"]
    assert all(
        len(g) == 2 and {s.metadata["lora_adapter"] for s in g} == {g[0].metadata["lora_adapter"]} for g in groups
    )
    assert all(g[0].prompt.startswith(g[0].metadata["lora_adapter"]) for g in groups)  # its own data (and input_key)
    state = source.state_dict()
    again = source.get_groups(2)
    source.load_state_dict(state)
    assert [g[0].prompt for g in source.get_groups(2)] == [g[0].prompt for g in again]
    # A request names its sample's adapter; one that names none is refused (there is no default adapter).
    with pytest.raises(ValueError, match="has no default adapter"):
        with_adapter(args, {"input_ids": [1]})
    assert with_adapter(args, {"input_ids": [1], "lora_path": "code"})["lora_path"] == "code"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"math": "data: math.jsonl\nnum_step: 10\n"},
            "`num_step` is set for all adapters at once here: use --num-rollout",
        ),
        ({"math": "data: math.jsonl\nrank: 8\n"}, "rank 8 differs from --lora-rank 4"),
        ({"math": "data: nowhere.jsonl\n"}, "nowhere.jsonl does not exist"),
        ({"math": "input_key: x\n"}, "the config needs `data: <prompt file>`"),
        ({"math": "data: math.jsonl\nlr: 1\n"}, "unknown key `lr`"),
    ],
)
def test_bad_adapter_configs_name_the_fix(base, adapters, capsys, change, message) -> None:
    for name, text in change.items():
        adapters[name].write_text(text)
    with pytest.raises(SystemExit):
        parse_args(_flags(base, adapters))
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--prompt-data", "x.jsonl"], "--multi-lora-adapter with --prompt-data: drop one of them"),
        (["--multi-lora-n-adapters", "1"], "--multi-lora-n-adapters 1 is below the 2 adapters given"),
        (["--advantage-estimator", "ppo"], "one critic cannot serve several adapters"),
        (["--eval-prompt-data", "e.jsonl"], "eval samples with --multi-lora-eval-adapter NAME (one of math, code)"),
        (["--eval-prompt-data", "e.jsonl", "--multi-lora-eval-adapter", "c"], "eval-adapter c: not an adapter of this"),
    ],
)
def test_multi_lora_contradictions_name_the_flags(base, adapters, capsys, extra, message) -> None:
    with pytest.raises(SystemExit):
        parse_args(_flags(base, adapters) + extra)
    assert message in capsys.readouterr().err


def test_resume_and_eval_flags_are_taken(base, adapters, tmp_path, capsys) -> None:
    """--load resumes a multi-LoRA run (lora_slots.py saves every adapter with its optimizer state); eval runs with
    the adapter --multi-lora-eval-adapter names; that flag alone, without adapters, names what it lacks."""
    (tmp_path / "e.jsonl").write_text('{"input": "2+2", "label": "4"}\n')
    extra = ["--load", str(tmp_path / "run"), "--eval-prompt-data", str(tmp_path / "e.jsonl")]
    args = parse_args(_flags(base, adapters) + extra + ["--multi-lora-eval-adapter", "code"])
    assert args.load == str(tmp_path / "run") and args.multi_lora_eval_adapter == "code"
    with pytest.raises(SystemExit):
        parse_args([*base, "--multi-lora-eval-adapter", "code"])
    assert "--multi-lora-eval-adapter code needs adapters" in capsys.readouterr().err


def test_kl_with_adapters_started_apart_is_refused(base, adapters, tmp_path, capsys) -> None:
    """The KL reference is one snapshot (the base with the adapter live at start): with adapters started from
    different adapter_paths it would not be each adapter's own start."""
    (tmp_path / "start").mkdir()
    (tmp_path / "start" / "adapter_config.json").write_text("{}")
    adapters["math"].write_text("data: math.jsonl\nadapter_path: start\n")
    parse_args(_flags(base, adapters))  # without a KL term: fine
    with pytest.raises(SystemExit):
        parse_args(_flags(base, adapters) + ["--use-kl-loss"])
    assert "start from an adapter_path (math): the KL reference is one snapshot" in capsys.readouterr().err


def test_eval_samples_carry_the_eval_adapter(base, adapters, tmp_path) -> None:
    """Each eval sample is tagged with --multi-lora-eval-adapter before it is generated, so the built-in generate
    sends it as lora_path and the reward function sees it, as for a training sample."""
    import asyncio

    from buffer.data_source import PromptDataset
    from rollout.context import RolloutContext
    from rollout.evaluation import evaluate_datasets
    from rollout.hooks import RolloutHooks
    from rollout.rewards import RewardFunction

    (tmp_path / "e.jsonl").write_text("".join(json.dumps({"prompt": f"q{i}", "label": "1"}) + "\n" for i in range(3)))
    flags = ["--eval-prompt-data", str(tmp_path / "e.jsonl"), "--multi-lora-eval-adapter", "code"]
    args = parse_args(_flags(base, adapters) + flags)
    seen = []

    async def generate(ctx, sample, params):
        seen.append(sample.metadata.get("lora_adapter"))
        sample.tokens, sample.response_length, sample.status = [1, 2], 1, Status.COMPLETED
        return sample

    reward = RewardFunction(lambda _, sample: float(sample.metadata["lora_adapter"] == "code"), inline=True)
    hooks = RolloutHooks(generate, False, reward, None)
    ctx = RolloutContext(args, None, "", None, None, hooks=hooks)  # type: ignore[arg-type]
    metrics, groups = asyncio.run(evaluate_datasets(ctx, {"e": PromptDataset(tmp_path / "e.jsonl")}, {}))
    assert seen == ["code"] * 3 and metrics["eval/e/reward_mean"] == 1.0


def test_an_adapters_share_holds_its_samples_alone() -> None:
    def sample(index: int, adapter: str, reward: float) -> Sample:
        s = Sample(index=index, tokens=[1, 2, 3 + index], response_length=1, reward=reward, status=Status.COMPLETED)
        s.metadata["lora_adapter"] = adapter
        return s

    # Groups of two: a, b, a, b, b, b; steps of four samples: [a a b b] [a a b b] [b b b b].
    order = ["a", "b", "a", "b", "b", "b"]
    groups = [[sample(2 * g + i, name, float(g + i)) for i in range(2)] for g, name in enumerate(order)]
    share = split_by_dp(build_train_data(groups), 1, 4)[0]
    assert adapter_names(share) == ["a", "b"]
    a = adapter_share(share, "a")
    assert a.data.sample_indices == [0, 1, 4, 5] and len(a.rollout) == 4 and a.rollout.lora_adapters == ["a"] * 4
    assert a.step_bounds == [(0, 2), (2, 4)] and a.steps == [[0, 1], [2, 3]]  # the b-only third step is dropped
    assert a.rows == [0, 1, 2, 3] and a.data.raw_rewards == [0.0, 1.0, 2.0, 3.0]
    b = adapter_share(share, "b")
    assert b.step_bounds == [(0, 2), (2, 4), (4, 8)] and b.data.group_ids == [1, 1, 3, 3, 4, 4, 5, 5]
    plain = split_by_dp(build_train_data([[Sample(index=0, tokens=[1, 2], response_length=1, reward=1.0)]]), 1, 1)[0]
    assert plain.data.lora_adapters == [] and adapter_names(plain) == []
    with pytest.raises(ValueError, match="not a multi-LoRA rollout"):
        adapter_share(plain, "a")
