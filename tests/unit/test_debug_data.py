"""slime's debug flags: rollout dumps in slime's file format, replay loading, subsampling, and the flag rules."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import pytest
import torch

from rollout.debug_data import load_rollout_data, save_rollout_data, save_train_data, validate_debug_args
from slime_like.core.errors import ArgumentError
from slime_like.core.sample import Sample, Status


def groups(n_groups: int = 3, n: int = 2) -> list[list[Sample]]:
    """Finished samples: group g, sample i has tokens [g, i, 7] and reward g + i / 10."""
    return [
        [
            Sample(
                prompt=f"p{g}",
                tokens=[g, i, 7],
                response="x",
                response_length=1,
                reward=g + i / 10,
                loss_mask=[1],
                rollout_log_probs=[-0.5 - g],
                status=Status.COMPLETED,
                group_index=g,
                index=g * n + i,
            )
            for i in range(n)
        ]
        for g in range(n_groups)
    ]


def args(**kw: object) -> Namespace:
    base = dict(save_debug_rollout_data=None, load_debug_rollout_data=None, load_debug_rollout_data_subsample=None,
                debug_rollout_only=False, debug_train_only=False, save_debug_train_data=None, fully_async=False)  # fmt: skip
    return Namespace(**{**base, **kw})


def test_a_template_writes_slime_s_file_and_loads_back(tmp_path: Path) -> None:
    template = str(tmp_path / "dump" / "{rollout_id}.pt")
    path = save_rollout_data(args(save_debug_rollout_data=template), 3, groups())
    assert path == tmp_path / "dump" / "3.pt"
    # slime's layout, which its load_debug_rollout_data reads: {"rollout_id", "samples": [Sample.to_dict()]}
    raw = torch.load(path, weights_only=False)
    assert raw["rollout_id"] == 3 and len(raw["samples"]) == 6 and raw["samples"][0]["status"] == "completed"
    loaded = load_rollout_data(template, 3)
    assert loaded == groups()
    eval_path = save_rollout_data(args(save_debug_rollout_data=template), 3, groups(), evaluation=True)
    assert eval_path == tmp_path / "dump" / "eval_3.pt"  # slime's name for an evaluation's dump


def test_without_a_path_the_jsonl_files_go_to_the_output_dir_and_replay(tmp_path: Path) -> None:
    a = args(save_debug_rollout_data="", output_dir=str(tmp_path))
    path = save_rollout_data(a, 12, groups())
    assert path == tmp_path / "rollouts" / "rollout_000012.jsonl"
    assert [json.loads(line)["index"] for line in path.read_text().splitlines()] == list(range(6))
    assert save_rollout_data(a, 12, groups(), evaluation=True) == tmp_path / "rollouts" / "eval_000012.jsonl"
    assert load_rollout_data(str(tmp_path / "rollouts" / "rollout_{rollout_id:06d}.jsonl"), 12) == groups()


def test_slime_s_subsample_keeps_the_first_and_last_samples(tmp_path: Path) -> None:
    template = str(tmp_path / "{rollout_id}.pt")
    save_rollout_data(args(save_debug_rollout_data=template), 0, groups(n_groups=5))  # 10 samples
    # int(10 * 0.5) = 5: slime keeps data[:5 // 2] + data[-5 // 2:], the first 2 and the last 3.
    kept = [s.index for g in load_rollout_data(template, 0, subsample=0.5) for s in g]
    assert kept == [0, 1, 7, 8, 9]
    assert [len(g) for g in load_rollout_data(template, 0, subsample=0.5)] == [2, 1, 2]  # regrouped by group


def test_a_missing_dump_names_the_rollout_and_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no saved rollout 4 at .*/4\.pt"):
        load_rollout_data(str(tmp_path / "{rollout_id}.pt"), 4)


def test_train_data_is_saved_with_slime_s_placeholders(tmp_path: Path) -> None:
    from buffer.train_data import build_train_data

    data = build_train_data(groups(), reward_key=None)
    path = save_train_data(str(tmp_path / "train_{rollout_id}_{rank}.pt"), 2, data)
    saved = torch.load(path)
    assert path.name == "train_2_0.pt" and saved["rollout_id"] == 2 and saved["tokens"] == data.tokens


def test_flag_rules_as_slime() -> None:
    a = args(load_debug_rollout_data="/d/{rollout_id}.pt")
    validate_debug_args(a)
    assert a.debug_train_only  # slime: loading rollouts means no servers
    with pytest.raises(ArgumentError, match="add --load-debug-rollout-data PATH"):
        validate_debug_args(args(debug_train_only=True))
    validate_debug_args(args(debug_train_only=True, rollout_function_path="slime.rollout.sft_rollout.generate_rollout"))
    with pytest.raises(ArgumentError, match="exclude each other"):
        validate_debug_args(args(debug_train_only=True, debug_rollout_only=True, load_debug_rollout_data="x"))
    with pytest.raises(ArgumentError, match="must differ"):
        validate_debug_args(args(save_debug_rollout_data="a.pt", save_debug_train_data="a.pt"))
    with pytest.raises(ArgumentError, match=r"fraction in \(0, 1\]"):
        validate_debug_args(args(load_debug_rollout_data="x", load_debug_rollout_data_subsample=1.5))


def test_the_flags_parse_as_slime_s(base: list[str]) -> None:
    from slime_like.arguments import parse_args

    assert parse_args(base + ["--save-debug-rollout-data"]).save_debug_rollout_data == ""
    parsed = parse_args(base + ["--save-debug-rollout-data", "/x/{rollout_id}.pt", "--load-debug-rollout-data", "/y"])
    assert parsed.save_debug_rollout_data == "/x/{rollout_id}.pt" and parsed.debug_train_only
