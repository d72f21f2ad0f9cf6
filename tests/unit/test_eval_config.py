"""slime's eval dataset config (--eval-config): every field of slime's EvalDatasetConfig is read with slime's
resolution (dataset > eval.defaults > flags), unknown fields are errors, and the eval generates and scores each
dataset with its own sampling parameters, sample count, metadata, generate function and reward."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path
from types import ModuleType

import pytest

from rollout.eval_config import FIELDS, NO_EFFECT, EvalDatasetConfig
from slime_like.arguments import parse_args
from slime_like.core.sample import Sample, Status

# Every field of slime's EvalDatasetConfig (slime/utils/eval_config.py at 624b824), in its order.
SLIME_FIELDS = ("name", "path", "rm_type", "custom_rm_path", "input_key", "label_key", "tool_key", "metadata_key",
    "multimodal_keys", "apply_chat_template", "apply_chat_template_kwargs", "n_samples_per_eval_prompt",
    "temperature", "top_p", "top_k", "max_response_len", "stop", "stop_token_ids", "min_new_tokens",
    "repetition_penalty", "skip_special_tokens", "no_stop_trim", "custom_generate_function_path", "app_service",
    "eval_task_timeout", "min_eval_samples", "eval_early_stop_remaining", "eval_early_stop_idle_timeout",
    "message_processor", "reward_model", "remote_environment", "metadata_overrides")  # fmt: skip


def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "eval.yaml"
    path.write_text(text)
    return path


def _parse(base: list[str], config: Path, *flags: str):
    return parse_args(base + ["--eval-config", str(config), *flags])


def test_the_fields_are_slimes() -> None:
    assert FIELDS == SLIME_FIELDS


def test_slimes_multi_task_example_parses_per_dataset(base: list[str], tmp_path: Path) -> None:
    # slime's examples/eval_multi_task/multi_task.yaml without its ifbench dataset (refused: no IFBench checkers).
    config = _yaml(
        tmp_path,
        """eval:
  defaults:
    max_response_len: 16384
    top_p: 0.7
  datasets:
    - name: aime
      path: /root/aime-2024/aime-2024.jsonl
      rm_type: deepscaler
      n_samples_per_eval_prompt: 16
    - name: f1set
      path: /root/f1.jsonl
      rm_type: f1
      n_samples_per_eval_prompt: 2
      top_p: 0.9
    - name: gpqa
      path: /root/gpqa/gpqa_eval.jsonl
      rm_type: gpqa
      n_samples_per_eval_prompt: 2
""",
    )
    args = _parse(base, config, "--eval-prompt-data", "other.jsonl", "--eval-temperature", "0.3")
    assert args.eval_datasets[:2] == [("aime", "/root/aime-2024/aime-2024.jsonl"), ("f1set", "/root/f1.jsonl")]
    aime, f1set, gpqa = args.eval_dataset_configs
    assert gpqa.rm_type == "gpqa"
    assert (aime.rm_type, aime.n_samples_per_eval_prompt, aime.top_p) == ("deepscaler", 16, 0.7)
    assert (f1set.rm_type, f1set.n_samples_per_eval_prompt, f1set.top_p) == ("f1", 2, 0.9)
    assert aime.max_response_len == f1set.max_response_len == 16384
    assert aime.temperature == 0.3  # neither sets it: --eval-temperature, as slime
    assert aime.top_k == args.rollout_top_k and aime.input_key == args.input_key  # flags last
    assert args.eval_interval is None  # the config alone does not turn evaluation on


def test_every_field_is_accepted_and_resolved(
    base: list[str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    entry = {
        "name": "all", "path": "all.jsonl", "rm_type": "remote_rm", "custom_rm_path": None, "input_key": "q",
        "label_key": "a", "tool_key": "tools", "metadata_key": "meta", "multimodal_keys": None,
        "apply_chat_template": True, "apply_chat_template_kwargs": {"enable_thinking": False},
        "n_samples_per_eval_prompt": 3, "temperature": 0.5, "top_p": 0.9, "top_k": 5, "max_response_len": 7,
        "stop": ["</a>"], "stop_token_ids": [3], "min_new_tokens": 1, "repetition_penalty": 1.1,
        "skip_special_tokens": True, "no_stop_trim": False, "custom_generate_function_path": None,
        "app_service": "http://x", "eval_task_timeout": 120, "min_eval_samples": 4, "eval_early_stop_remaining": 2,
        "eval_early_stop_idle_timeout": 3.5, "message_processor": {"a": 1}, "reward_model": {"b": 2},
        "remote_environment": {"c": 3}, "metadata_overrides": {"task": "x"},
    }  # fmt: skip
    assert set(entry) == set(SLIME_FIELDS)
    config = _yaml(tmp_path, json.dumps({"eval": {"datasets": [entry]}}))  # JSON is YAML
    with caplog.at_level(logging.WARNING, logger="rollout.eval_config"):
        args = _parse(base, config, "--rm-url", "http://rm")
    (got,) = args.eval_dataset_configs
    assert got.rm_type == "remote"  # slime's name for the remote reward model
    assert {k: getattr(got, k) for k in entry if k != "rm_type"} == {k: v for k, v in entry.items() if k != "rm_type"}
    assert all(name in caplog.text for name in NO_EFFECT) and "accepted without effect" in caplog.text
    assert got.inject_metadata({"x": 1}) == {"x": 1, "rm_type": "remote", "task": "x"}
    params = got.sampling_params({"temperature": 1.0, "max_new_tokens": 99, "skip_special_tokens": False})
    assert params == {"temperature": 0.5, "top_p": 0.9, "top_k": 5, "max_new_tokens": 7, "stop": ["</a>"],
                      "stop_token_ids": [3], "min_new_tokens": 1, "repetition_penalty": 1.1,
                      "skip_special_tokens": True, "no_stop_trim": False}  # fmt: skip


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("    temperture: 0.6\n", "dataset 'a' sets 'temperture', which is not a field of slime's eval dataset"),
        ("    top_k: high\n", "'top_k' must be int, got str 'high'"),
        ("    rm_type: ifbench\n", "rm_type 'ifbench' is not supported here: "),
        ("    multimodal_keys: {video: clips}\n", "multimodal_keys: --multimodal-keys: ['video'] not supported"),
        ("    n_samples_per_eval_prompt: 0\n", "n_samples_per_eval_prompt must be at least 1"),
        ("    min_eval_samples: 0\n", "min_eval_samples must be positive"),
        ("    custom_rm_path: no_such_module.reward\n", "cannot import module 'no_such_module'"),
    ],
)
def test_a_field_that_cannot_be_honoured_is_an_error_naming_it(
    base: list[str], tmp_path: Path, capsys: pytest.CaptureFixture, text: str, message: str
) -> None:
    config = _yaml(tmp_path, "eval:\n  datasets:\n  - name: a\n    path: a.jsonl\n" + text)
    with pytest.raises(SystemExit):
        _parse(base, config)
    assert message in capsys.readouterr().err


def test_defaults_are_held_to_the_same_fields(base: list[str], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = _yaml(tmp_path, "eval:\n  defaults:\n    n_sample: 2\n  datasets:\n  - name: a\n    path: a.jsonl\n")
    with pytest.raises(SystemExit):
        _parse(base, config)
    assert "eval.defaults sets 'n_sample', which is not a field" in capsys.readouterr().err
    config.write_text("eval:\n  datasets:\n    a: {path: a.jsonl, temperature: 0.0}\n  extra: 1\n")
    with pytest.raises(SystemExit):
        _parse(base, config)
    assert "unknown key(s) ['extra'] in eval" in capsys.readouterr().err
    config.write_text("datasets:\n  a: {path: a.jsonl, temperature: 0.0}\n")  # a mapping at the root, as slime
    (got,) = _parse(base, config, "--eval-temperature", "0.7").eval_dataset_configs
    assert (got.name, got.temperature) == ("a", 0.0)  # 0 is a value: it wins over the flag


def test_eval_prompt_data_gets_configs_from_the_flags(base: list[str]) -> None:
    args = parse_args(base + ["--eval-prompt-data", "aime", "a.jsonl", "--n-samples-per-eval-prompt", "4",
                              "--eval-input-key", "question", "--eval-top-k", "3"])  # fmt: skip
    (got,) = args.eval_dataset_configs
    assert (got.name, got.path, got.n_samples_per_eval_prompt, got.input_key, got.top_k) == (
        "aime", "a.jsonl", 4, "question", 3)  # fmt: skip
    assert got.rm_type is None and got.custom_rm_path is None and got.metadata_overrides == {}


# Per-dataset reward and generate functions (rollout/eval_hooks.py), in an eval with a stand-in generate.

PLUGIN = "eval_config_plugins"


@pytest.fixture
def plugins() -> ModuleType:
    """A module of plugins: a reward that scores 7 and a generate function that answers "B"."""
    module = ModuleType(PLUGIN)

    def seven(args, sample):
        return 7.0

    async def answer_b(ctx, sample, params):
        sample.response, sample.tokens, sample.response_length = "B", [1, 2], 1
        sample.metadata["params"] = dict(params)
        sample.status = Status.COMPLETED
        return sample

    module.seven, module.answer_b = seven, answer_b
    sys.modules[PLUGIN] = module
    yield module
    del sys.modules[PLUGIN]


def _rows(path: Path, label: str) -> str:
    path.write_text("".join(json.dumps({"input": f"q{i}", "label": label}) + "\n" for i in range(2)))
    return str(path)


def test_each_dataset_is_generated_and_scored_by_its_own_fields(
    base: list[str], tmp_path: Path, plugins: ModuleType
) -> None:
    from rollout.context import RolloutContext
    from rollout.eval_hooks import all_dataset_hooks, reward_choice
    from rollout.evaluation import evaluate_datasets, load_eval_dataset
    from rollout.hooks import load_hooks

    config = _yaml(
        tmp_path,
        f"""eval:
  defaults:
    temperature: 0.0
    metadata_overrides: {{split: test}}
  datasets:
  - {{name: math, path: {_rows(tmp_path / "m.jsonl", "2")}, n_samples_per_eval_prompt: 2, max_response_len: 5}}
  - {{name: exact, path: {_rows(tmp_path / "e.jsonl", "2")}, rm_type: exact, stop: ["</s>"]}}
  - {{name: custom, path: {_rows(tmp_path / "c.jsonl", "2")}, custom_rm_path: {PLUGIN}.seven}}
  - {{name: own_gen, path: {_rows(tmp_path / "g.jsonl", "B")}, rm_type: exact,
      custom_generate_function_path: {PLUGIN}.answer_b}}
""",
    )
    args = _parse(base, config, "--label-key", "label", "--custom-generate-function-path", f"{__name__}.answer_a")
    configs = {c.name: c for c in args.eval_dataset_configs}
    assert reward_choice(args, configs["math"]) == (None, "math")  # --rm-type's default: the run's reward
    assert reward_choice(args, configs["custom"]) == (f"{PLUGIN}.seven", "math")
    hooks = load_hooks(args)
    own = all_dataset_hooks(args, hooks, list(configs.values()))
    assert set(own) == {"exact", "custom", "own_gen"}  # math scores and generates as the run does
    assert own["exact"].generate is hooks.generate and own["exact"].reward is not hooks.reward
    datasets = {name: load_eval_dataset(args, c, None) for name, c in configs.items()}
    ctx = RolloutContext(args, None, "", None, None, hooks=hooks)  # type: ignore[arg-type]
    metrics, groups = asyncio.run(evaluate_datasets(ctx, datasets, {"temperature": 1.0, "max_new_tokens": 64}, own))

    by_name: dict[str, list[Sample]] = {}
    for group in groups:
        by_name.setdefault(group[0].metadata["eval_dataset"], []).extend(group)
    assert {name: len(s) for name, s in by_name.items()} == {"math": 4, "exact": 2, "custom": 2, "own_gen": 2}
    assert metrics["eval/math/pass@2"] == 1.0 and "eval/exact/pass@2" not in metrics  # k up to each dataset's n
    # math: "Answer: 2" has the label 2; exact: it is not exactly "2"; custom: 7; own_gen: "B" is its label.
    assert [metrics[f"eval/{n}/reward_mean"] for n in ("math", "exact", "custom", "own_gen")] == [1.0, 0.0, 7.0, 1.0]
    params = {name: samples[0].metadata["params"] for name, samples in by_name.items()}
    assert (params["math"]["temperature"], params["math"]["max_new_tokens"]) == (0.0, 5)  # defaults, then its own
    assert params["exact"]["stop"] == ["</s>"] and params["exact"]["max_new_tokens"] == args.rollout_max_response_len
    assert all(s.metadata["split"] == "test" for samples in by_name.values() for s in samples)
    assert all(s.metadata["rm_type"] == "exact" for s in by_name["exact"])  # slime's inject_metadata


async def answer_a(ctx, sample, params):
    """The run's generate function in the test above: answers "Answer: 2"."""
    sample.response, sample.tokens, sample.response_length = "Answer: 2", [1, 2], 1
    sample.metadata["params"] = dict(params)
    sample.status = Status.COMPLETED
    return sample


def test_config_dataclass_matches_slimes_defaults() -> None:
    config = EvalDatasetConfig(name="a", path="a.jsonl")
    assert config.metadata_overrides == {} and config.inject_metadata(None) == {}
    assert all(getattr(config, f) is None for f in SLIME_FIELDS[2:-1])
