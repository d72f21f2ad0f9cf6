"""slime's --disable-rollout-global-dataset: no prompt dataset; a rollout function fills empty samples."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from buffer.data_source import EmptySource
from slime_like.arguments import parse_args

# A slime rollout function that supplies its own data: the prompt, tokens, response and reward of each empty sample.
PLUGIN = """
from slime.utils.types import Sample

SEEN = []


def generate_rollout(args, rollout_id, data_source, evaluation=False):
    groups = data_source.get_samples(args.rollout_batch_size)
    for group in groups:
        for sample in group:
            SEEN.append((sample.prompt, sample.label, sample.group_index, sample.index))
            sample.prompt = f"task {sample.group_index}"
            sample.tokens = [1, 2, 3, 4]
            sample.response, sample.response_length = "ok", 2
            sample.loss_mask = [1, 1]
            sample.reward = float(sample.index % 2)
            sample.status = Sample.Status.COMPLETED
    return groups
"""


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "own_data_rollout.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "own_data_rollout.generate_rollout"
    sys.modules.pop("own_data_rollout", None)


def test_empty_source_numbers_groups_and_resumes() -> None:
    source = EmptySource(2)
    first, second = source.get_groups(2)
    assert [(s.prompt, s.label, s.group_index, s.index) for s in first + second] == [
        ("", None, 0, 0), ("", None, 0, 1), ("", None, 1, 2), ("", None, 1, 3),
    ]  # fmt: skip
    again = EmptySource(2)
    again.load_state_dict(source.state_dict())
    assert [s.index for s in again.get_groups(1)[0]] == [4, 5] and len(again) == 0


def test_flag_needs_a_rollout_function_and_no_epochs(
    base: list[str], plugin: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert parse_args(base).rollout_global_dataset is True
    with pytest.raises(SystemExit):
        parse_args(base + ["--disable-rollout-global-dataset"])
    assert "--disable-rollout-global-dataset leaves the run without prompts" in capsys.readouterr().err
    no_rollouts = [a for a in base if a not in ("--num-rollout", "3")]
    with pytest.raises(SystemExit):
        parse_args(
            no_rollouts + ["--disable-rollout-global-dataset", "--rollout-function-path", plugin, "--num-epoch", "1"]
        )
    assert "--num-epoch counts the prompts of --prompt-data, which --disable" in capsys.readouterr().err


def test_a_rollout_function_supplies_the_data(base: list[str], plugin: str, tmp_path: Path) -> None:
    from rollout.manager import RolloutManager

    flags = [a for a in base if a not in ("--prompt-data", "x.jsonl")]  # no --prompt-data: nothing to read
    args = parse_args(flags + ["--disable-rollout-global-dataset", "--rollout-function-path", plugin,
                               "--debug-train-only", "--output-dir", str(tmp_path / "out")])  # fmt: skip
    assert args.rollout_global_dataset is False and args.prompt_data is None
    manager = RolloutManager(args)
    try:
        _check_rollouts(manager)
    finally:
        manager.shutdown()


def _check_rollouts(manager: object) -> None:
    groups, metrics = manager.generate(0)  # type: ignore[attr-defined]
    seen = sys.modules["own_data_rollout"].SEEN
    assert [(p, label) for p, label, _, _ in seen] == [("", None)] * 8  # 4 groups of 2 empty samples
    assert [(g, i) for _, _, g, i in seen] == [(g, g * 2 + k) for g in range(4) for k in range(2)]
    assert [s.prompt for g in groups for s in g] == [f"task {g}" for g in range(4) for _ in range(2)]
    assert metrics["rollout/reward_mean"] == 0.5
    manager.generate(1)  # type: ignore[attr-defined]
    assert [g for _, _, g, _ in seen[8:]] == [4, 4, 5, 5, 6, 6, 7, 7]  # numbered on, as slime's source
