"""Argument parsing: derived defaults, passthrough, and errors naming the flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from slime_like.arguments import parse_args


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
        (
            ["--actor-num-gpus-per-node", "2", "--context-parallel-size", "4"],
            "trainer ranks (--actor-num-nodes x --actor-num-gpus-per-node = 2) must be a multiple of TP x PP x CP = 4",
        ),
        (["--save-interval", "2"], "--save-interval needs --save"),
        (["--rollout-temperature", "0"], "--rollout-temperature 0.0: training needs the sampling policy's log-probs"),
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


def test_sequence_parallel_flag_and_its_checks(base: list[str], capsys: pytest.CaptureFixture) -> None:
    from slime_like.trainer.megatron.cpu_compat import transformer_engine_available
    from slime_like.trainer.megatron.parallel import check_sequence_parallel
    from slime_like.trainer.training_arguments import validate_megatron_args

    args = parse_args(
        base + ["--sequence-parallel", "--tensor-model-parallel-size", "2", "--actor-num-gpus-per-node", "2"]
    )
    assert args.sequence_parallel and args.context_parallel_size == 1
    validate_megatron_args(args)
    assert not parse_args(base).sequence_parallel
    capsys.readouterr()
    # TP 1: turned off with one warning line, as Megatron-LM does (tests/unit/test_slime_flags.py has more).
    assert not parse_args(base + ["--sequence-parallel"]).sequence_parallel
    assert capsys.readouterr().err.count("warning: --sequence-parallel is off") == 1
    # The device check at start-up on the trainer ranks, where the device is known.
    check_sequence_parallel(True, tp=1)
    check_sequence_parallel(False, tp=1)
    if not transformer_engine_available():
        with pytest.raises(ValueError, match="--sequence-parallel needs CUDA with Transformer Engine"):
            check_sequence_parallel(True, tp=2)


@pytest.mark.parametrize(
    ("flags", "use_gpu", "bf16", "line"),
    [
        ([], False, False, "precision: training and rollout in float32 (the CPU default; --bf16 for bfloat16)"),
        ([], True, True, "precision: training and rollout in bfloat16 (the GPU default, as slime)"),
        (["--bf16"], False, True, "precision: training and rollout in bfloat16 (--bf16)"),
        (["--no-bf16", "--sglang-dtype", "float"], True, False, "precision: training and rollout in float32"),
    ],
)
def test_precision_follows_the_devices_unless_given(base, flags, use_gpu, bf16, line) -> None:
    from rollout.arguments import server_dtype
    from slime_like.arguments import resolve_precision

    args = parse_args(base + flags)
    assert resolve_precision(args, use_gpu).startswith(line)
    assert args.bf16 is bf16 and server_dtype(args) == ("bfloat16" if bf16 else "float32")


def test_servers_at_another_precision_than_training_are_refused(base: list[str]) -> None:
    from slime_like.arguments import resolve_precision
    from slime_like.core.errors import ArgumentError

    args = parse_args(base + ["--sglang-dtype", "float16"])
    with pytest.raises(ArgumentError, match=r"--sglang-dtype float16: .* than the trainer \(float32, the CPU default"):
        resolve_precision(args, use_gpu=False)
