"""Filters, the buffer filter, post-rollout hooks, pass@k, eval dataset flags, and plugin loading errors."""

from __future__ import annotations

import asyncio
import json
import math
import sys
from argparse import Namespace
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest

from buffer.buffer import Buffer
from buffer.data_source import DataSource, PromptDataset
from rollout.arguments import validate_rollout_args
from rollout.context import RolloutContext
from rollout.eval_config import eval_datasets
from rollout.evaluation import ks_for, pass_at_k
from rollout.filters import FilterResult, apply_dynamic_filter, check_reward_nonzero_std
from rollout.hooks import RolloutHooks
from rollout.postprocess import finish_rollout
from slime_like.arguments import build_parser
from slime_like.core.errors import PluginError
from slime_like.core.sample import Sample, Status
from tests.conftest import REPO_ROOT


def group(rewards: list[Any], status: Status = Status.COMPLETED) -> list[Sample]:
    return [
        Sample(reward=r, index=i, response_length=2, loss_mask=[1, 1], status=status) for i, r in enumerate(rewards)
    ]


def test_zero_std_groups_are_dropped() -> None:
    args = Namespace(reward_key=None)
    assert check_reward_nonzero_std(args, group([1.0, 1.0, 1.0])) == FilterResult(False, "zero_std")
    assert check_reward_nonzero_std(args, group([1.0, 0.0])).keep
    # slime's threshold: unbiased std strictly above 1e-6. [0, 2e-6]: std sqrt(2e-12) = 1.41e-6 keeps;
    # [0, 1e-6]: 7.1e-7 drops; a single usable reward has no std and drops.
    assert check_reward_nonzero_std(args, group([0.0, 2e-6])).keep
    assert not check_reward_nonzero_std(args, group([0.0, 1e-6])).keep
    assert not check_reward_nonzero_std(args, group([1.0])).keep
    # Failed samples carry no reward: a group whose usable samples all agree has no signal.
    g = group([1.0, 1.0, 0.0])
    g[2].status = Status.FAILED
    assert not check_reward_nonzero_std(args, g).keep
    assert check_reward_nonzero_std(Namespace(reward_key="acc"), group([{"acc": 1.0}, {"acc": 0.0}])).keep


def test_dynamic_filter_results() -> None:
    def no_short(args: Any, g: list[Sample]) -> bool:
        return False

    assert apply_dynamic_filter(None, None, group([1.0])).keep
    assert apply_dynamic_filter(no_short, None, group([1.0])) == FilterResult(False, "no_short")
    with pytest.raises(TypeError, match="--dynamic-sampling-filter-path.*expected a bool"):
        apply_dynamic_filter(lambda a, g: "keep", None, group([1.0]))


@pytest.fixture
def source(tmp_path: Path) -> DataSource:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"q{i}", "label": str(i)}) + "\n" for i in range(10)))
    return DataSource(PromptDataset(path), 1, shuffle=False)


def test_buffer_filter_picks_returned_groups(source: DataSource) -> None:
    def newest_first(args: Any, groups: list[list[Sample]], n: int) -> list[list[Sample]]:
        return list(reversed(groups))[:n]

    buf = Buffer(source, newest_first)
    buf.add_groups(buf.get_groups(3))
    assert [g[0].prompt for g in buf.get_groups(2)] == ["q2", "q1"]
    assert [g[0].prompt for g in buf.get_groups(2)] == ["q0", "q3"]  # the one left, then fresh ones
    assert len(buf) == 0


def test_buffer_filter_must_return_groups_it_was_given(source: DataSource) -> None:
    buf = Buffer(source, lambda args, groups, n: [[Sample()]])
    buf.add_groups(buf.get_groups(2))
    with pytest.raises(ValueError, match="--buffer-filter-path"):
        buf.get_groups(1)


def ctx_with(**hooks: Any) -> RolloutContext:
    full = dict(generate=None, group_generate=False, reward=None, buffer_filter=None, **hooks)
    return RolloutContext(Namespace(reward_key=None), None, "", None, None, hooks=RolloutHooks(**full))  # type: ignore[arg-type]


def test_sample_filter_zeroes_loss_and_post_process_keeps_raw_reward() -> None:
    ctx = ctx_with(
        sample_filter=lambda args, g: [s.index != 1 for s in g],
        reward_post_process=lambda args, g: [float(s.reward) - 0.5 for s in g],
    )
    groups = [group([1.0, 0.0])]
    finish_rollout(ctx, groups)
    assert [s.loss_mask for s in groups[0]] == [[1, 1], [0, 0]]
    assert groups[0][1].metadata["excluded_from_loss"] and ctx.counters["samples_excluded_from_loss"] == 1
    assert [(s.reward, s.metadata["raw_reward"]) for s in groups[0]] == [(0.5, 1.0), (-0.5, 0.0)]
    bad = ctx_with(reward_post_process=lambda args, g: [1.0])
    with pytest.raises(TypeError, match="--custom-reward-post-process-path.*one entry per sample"):
        finish_rollout(bad, [group([1.0, 0.0])])


def test_pass_at_k_matches_enumeration() -> None:
    for n, c in [(4, 0), (4, 1), (4, 2), (5, 3), (8, 8)]:
        correct = [True] * c + [False] * (n - c)
        for k in ks_for(n):
            subsets = list(combinations(correct, k))
            assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
    assert ks_for(1) == [1] and ks_for(6) == [1, 2, 4, 6] and ks_for(8) == [1, 2, 4, 8]
    assert math.isclose(pass_at_k(10, 1, 1), 0.1)


def test_eval_prompt_data_forms() -> None:
    assert eval_datasets(["data/aime.jsonl"]) == [("aime", "data/aime.jsonl")]
    assert eval_datasets(["a", "x.jsonl", "b", "y.parquet"]) == [("a", "x.jsonl"), ("b", "y.parquet")]
    with pytest.raises(ValueError, match="one path or NAME PATH pairs"):
        eval_datasets(["a", "x.jsonl", "b"])
    with pytest.raises(ValueError, match="unique"):
        eval_datasets(["a", "x.jsonl", "a", "y.jsonl"])


PLUGIN = """
async def gen(ctx, sample, params):
    return sample

def sync_gen(ctx, sample, params):
    return sample

def two(args, group):
    return True

def one(args):
    return True

def three(args, groups, data_source):
    return None

async def rollout(ctx, rollout_id, buffer):
    return []
"""


@pytest.fixture
def plugin_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "my_hooks.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_hooks"
    sys.modules.pop("my_hooks", None)


def parsed(*extra: str) -> Namespace:
    args, _ = build_parser().parse_known_args(
        ["--hf-checkpoint", "x", "--prompt-data", "p.jsonl", "--rollout-batch-size", "2", "--num-rollout", "1", *extra]
    )
    return args


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--custom-generate-function-path", "my_hooks.sync_gen"], "--custom-generate-function-path=.*async def"),
        (["--custom-generate-function-path", "my_hooks.nope"], "has no attribute 'nope'"),
        (["--dynamic-sampling-filter-path", "my_hooks.one"], "--dynamic-sampling-filter-path=.*2 positional"),
        (["--buffer-filter-path", "my_hooks.two"], "--buffer-filter-path=.*3 positional"),
        (["--rollout-sample-filter-path", "my_hooks.gen"], "--rollout-sample-filter-path=.*plain function"),
        (["--custom-reward-post-process-path", "nomodule.fn"], "--custom-reward-post-process-path=.*cannot import"),
        (["--rollout-function-path", "my_hooks.two"], "--rollout-function-path=.*async def"),
        (["--eval-function-path", "my_hooks"], "--eval-function-path=.*dotted path"),
        (["--rollout-all-samples-process-path", "my_hooks.two"], "--rollout-all-samples-process-path=.*3 positional"),
        (
            ["--rollout-function-path", "my_hooks.rollout", "--rollout-all-samples-process-path", "my_hooks.three"],
            "--rollout-all-samples-process-path is called by the built-in rollout only",
        ),
        (["--data-source-path", "my_hooks.one"], "--data-source-path=.*2 positional"),
        (["--custom-rm-path", "my_hooks.one"], "--custom-rm-path=.*2 positional"),
        (["--group-rm"], "--group-rm needs --custom-rm-path"),
        (["--group-generate"], "--group-generate needs --custom-generate-function-path"),
        (["--rm-type", "remote"], "--rm-type remote needs --rm-url"),
        (["--mask-offpolicy-in-partial-rollout"], "needs --partial-rollout"),
        (["--eval-prompt-data", "a", "b", "c"], "--eval-prompt-data takes one path"),
    ],
)
def test_bad_plugins_and_flags_name_the_flag(plugin_module: str, extra: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_rollout_args(parsed(*extra))


def test_good_plugins_load_and_defaults_fill(plugin_module: str) -> None:
    args = parsed(
        "--custom-generate-function-path", "my_hooks.gen", "--dynamic-sampling-filter-path", "my_hooks.two",
        "--eval-prompt-data", "e.jsonl",
    )  # fmt: skip
    validate_rollout_args(args)
    assert args.over_sampling_batch_size == 2 and args.eval_datasets == [("e", "e.jsonl")]
    assert issubclass(PluginError, ValueError)  # parse_args turns it into a usage error naming the flag


# Every example named in docs/plugins.md loads under its flag (signature and async-ness checked).
EXAMPLES = [
    ("--rollout-function-path", "plugins.rollout_function.rollout"),
    ("--custom-generate-function-path", "plugins.tool_agent.generate"),
    ("--custom-rm-path", "plugins.custom_rewards.boxed_math_with_format"),
    ("--dynamic-sampling-filter-path", "rollout.filters.check_reward_nonzero_std"),
    ("--dynamic-sampling-filter-path", "plugins.custom_filters.drop_all_truncated"),
    ("--buffer-filter-path", "plugins.custom_filters.most_progress_first"),
    ("--rollout-sample-filter-path", "plugins.custom_filters.exclude_truncated"),
    ("--custom-reward-post-process-path", "plugins.custom_filters.overlong_penalty"),
    ("--eval-function-path", "plugins.majority_eval.evaluate_with_majority"),
    ("--data-source-path", "plugins.data_sources.ReasoningGymSource"),
]


@pytest.mark.parametrize(("flag", "path"), EXAMPLES)
def test_documented_examples_load(flag: str, path: str) -> None:
    validate_rollout_args(parsed(flag, path))
    assert f"`{path}`" in (REPO_ROOT / "docs" / "plugins.md").read_text()


def test_group_examples_load() -> None:
    validate_rollout_args(
        parsed("--custom-generate-function-path", "plugins.group_generate.generate_group", "--group-generate",
               "--custom-rm-path", "plugins.custom_rewards.majority_vote", "--group-rm")
    )  # fmt: skip


def test_example_rewards_and_filters() -> None:
    from plugins.custom_filters import drop_all_truncated, exclude_truncated, most_progress_first, overlong_penalty
    from plugins.custom_rewards import boxed_math_with_format, majority_vote

    s = Sample(response="so \\boxed{4}", label="4")
    assert boxed_math_with_format(None, s) == {"score": 1.1, "correct": 1.0, "formatted": 1.0}
    votes = [Sample(response=f"\\boxed{{{a}}}") for a in ("3", "4", "4", "x")] + [Sample(response="none")]
    assert asyncio.run(majority_vote(None, votes)) == [0.0, 1.0, 1.0, 0.0, 0.0]

    args = Namespace(reward_key=None, rollout_max_response_len=100)
    truncated = group([1.0, 0.0], status=Status.TRUNCATED)
    assert drop_all_truncated(args, truncated) == FilterResult(False, "all_truncated")
    assert drop_all_truncated(args, group([1.0, 0.0])).keep
    assert exclude_truncated(args, truncated + group([1.0])) == [False, False, True]
    g = group([1.0, 1.0, 0.0])
    for s, n in zip(g, (10, 68, 100), strict=True):
        s.response_length = n
    assert overlong_penalty(args, g) == pytest.approx([1.0, 1.0 - (68 - 36) / 64, -1.0])  # penalty from token 36
    assert [x[0].index for x in most_progress_first(args, [[g[0]], [g[2]], [g[1]]], 2)] == [2, 1]
