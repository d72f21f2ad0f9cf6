"""Argument parsing: derived defaults, passthrough, and errors naming the flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from slime_like.arguments import parse_args


@pytest.fixture
def base(tiny_qwen3: Path) -> list[str]:
    return [
        "--hf-checkpoint",
        str(tiny_qwen3),
        "--prompt-data",
        "x.jsonl",
        "--rollout-batch-size",
        "4",
        "--n-samples-per-prompt",
        "2",
        "--num-rollout",
        "3",
    ]


def test_defaults_and_sglang_passthrough(base: list[str]) -> None:
    args = parse_args(base + ["--sglang-dtype", "float32", "--sglang-disable-radix-cache", "--lr", "1e-5"])
    assert args.global_batch_size == 8 and args.eps_clip_high == args.eps_clip == 0.2
    assert args.sglang_server_args == ["--dtype", "float32", "--disable-radix-cache"]
    assert args.lr == 1e-5 and args.data_parallel_size == 1


def test_unknown_flag_is_an_error(base: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(base + ["--rollout-batchsize", "3"])
    assert "unrecognized arguments: --rollout-batchsize 3" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--global-batch-size", "3"], "must be a multiple of --global-batch-size 3"),
        (["--actor-num-gpus-per-node", "3", "--tensor-model-parallel-size", "2"], "TP x PP x CP = 2"),
        (["--save-interval", "2"], "--save-interval needs --save"),
        (["--use-kl-loss"], "--kl-loss-coef"),
    ],
)
def test_contradictions_name_the_flags(
    base: list[str], capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    with pytest.raises(SystemExit):
        parse_args(base + extra)
    assert message in capsys.readouterr().err


def test_missing_checkpoint(base: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(base + ["--hf-checkpoint", str(tmp_path / "nope")])
    assert "no config.json" in capsys.readouterr().err
