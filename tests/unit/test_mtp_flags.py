"""--enable-mtp-training, --mtp-num-layers and --mtp-loss-scaling-factor with slime's meaning: slime's MiMo EAGLE
launch script starts, and so does GLM-4.7-Flash's at its PP 2 x CP 2 layout; the flag is refused, naming the cause,
where the family or the checkpoint's MTP layers do not allow it; without the flag the MTP flags stay accepted without
effect."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import pytest

from slime_like.arguments import parse_args
from slime_like.trainer.megatron.flags import (
    model_config_overrides,
    mtp_config_problems,
    mtp_engine_args,
    no_effect_flags,
)
from tests.unit.test_slime_flags import SLIME_MODEL_FILES
from tools.reference_configs import write_reference_config

# scripts/run-mimo-7B-rl-eagle.sh of slime (its checkpoint paths left out): TP 2 with SP, EAGLE serving, MTP training.
MIMO_EAGLE_RUN = [
    "--prompt-data", "dapo-math-17k.jsonl", "--input-key", "prompt", "--label-key", "label", "--apply-chat-template",
    "--rollout-shuffle", "--rm-type", "deepscaler", "--num-rollout", "3000", "--rollout-batch-size", "32",
    "--n-samples-per-prompt", "8", "--rollout-max-response-len", "8192", "--rollout-temperature", "1",
    "--global-batch-size", "256", "--balance-data",
    "--tensor-model-parallel-size", "2", "--sequence-parallel", "--pipeline-model-parallel-size", "1",
    "--context-parallel-size", "1", "--expert-model-parallel-size", "1", "--expert-tensor-parallel-size", "1",
    "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
    "--use-dynamic-batch-size", "--max-tokens-per-gpu", "9216",
    "--advantage-estimator", "grpo", "--use-kl-loss", "--kl-loss-coef", "0.00", "--kl-loss-type", "low_var_kl",
    "--entropy-coef", "0.00", "--eps-clip", "0.2", "--eps-clip-high", "0.28",
    "--optimizer", "adam", "--lr", "1e-6", "--lr-decay-style", "constant", "--weight-decay", "0.1",
    "--adam-beta1", "0.9", "--adam-beta2", "0.98",
    "--rollout-num-gpus-per-engine", "1", "--sglang-mem-fraction-static", "0.7",
    "--sglang-speculative-algorithm", "EAGLE", "--sglang-speculative-num-steps", "3",
    "--sglang-speculative-eagle-topk", "1", "--sglang-speculative-num-draft-tokens", "4",
    "--sglang-attention-backend", "fa3",
    "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--accumulate-allreduce-grads-in-fp32",
    "--attention-softmax-in-fp32", "--attention-backend", "flash",
    "--enable-mtp-training", "--mtp-loss-scaling-factor", "0.2",
    "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "8", "--colocate",
]  # fmt: skip


@pytest.fixture(scope="module")
def mimo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_reference_config("mimo-7B-rl", tmp_path_factory.mktemp("mimo-7B-rl"))


def _argv(hf: Path, *extra: str) -> list[str]:
    return [*SLIME_MODEL_FILES["mimo-7B-rl"], "--hf-checkpoint", str(hf), *MIMO_EAGLE_RUN, *extra]


def test_slime_mimo_eagle_script_trains_mtp(mimo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = parse_args(_argv(mimo))
    assert mtp_engine_args(args) == {"mtp_layers": 1, "mtp_loss_scaling_factor": 0.2}
    assert not {"--mtp-num-layers", "--mtp-loss-scaling-factor"} & set(no_effect_flags(args, False, False))
    with pytest.raises(SystemExit) as exit_:
        parse_args(_argv(mimo, "--dry-run"))
    assert exit_.value.code == 0 and "dry run: OK" in capsys.readouterr().out


def test_mtp_flags_without_training_change_nothing(mimo: Path) -> None:
    argv = [a for a in _argv(mimo) if a != "--enable-mtp-training"]
    args = parse_args(argv + ["--mtp-loss-scaling-factor", "0.1"])
    assert mtp_engine_args(args) == {}
    assert {"--mtp-num-layers", "--mtp-loss-scaling-factor"} <= set(no_effect_flags(args, False, False))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("--mtp-num-layers", None), "--enable-mtp-training needs --mtp-num-layers N"),
        (("--mtp-num-layers", "2"), "--mtp-num-layers 2 contradicts num_nextn_predict_layers=1"),
    ],
)
def test_mtp_training_refused(
    change: tuple[str, str | None], message: str, mimo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flag, value = change
    argv = _argv(mimo)
    while flag in argv:  # the model file's value goes too
        i = argv.index(flag)
        del argv[i : i + 2]
    with pytest.raises(SystemExit):
        parse_args(argv + ([flag, value] if value is not None else []))
    assert message in capsys.readouterr().err


def test_mtp_config_problems(mimo: Path, tmp_path: Path) -> None:
    from slime_like.trainer.model_arguments import read_hf_config

    on = Namespace(enable_mtp_training=True)
    assert mtp_config_problems(on, read_hf_config(str(mimo))) == []
    assert mtp_config_problems(Namespace(enable_mtp_training=False), read_hf_config(str(mimo))) == []
    config = json.loads((mimo / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 0}))
    for name in mimo.glob("*.py"):  # MiMo's config class travels with its config.json
        (tmp_path / name.name).write_bytes(name.read_bytes())
    assert mtp_config_problems(on, read_hf_config(str(tmp_path))) == [
        "--enable-mtp-training: the checkpoint has no MTP layers (num_nextn_predict_layers is 0 or absent)"
    ]
    assert mtp_config_problems(on, read_hf_config(str(write_reference_config("glm4.7-flash", tmp_path / "glm")))) == []
    glm5 = write_reference_config("glm5-744B-A40B", tmp_path / "glm5")  # its MTP layer has DSA attention
    (problem,) = mtp_config_problems(on, read_hf_config(str(glm5)))
    assert (
        "MTP layers are trained for mimo, deepseek_v3, kimi_k2, glm4_moe_lite, glm4_moe only, not model_type "
        in problem
    )


def _glm47_flash_run(hf: Path) -> list[str]:
    """slime's run-glm4.7-30B-A3B.sh with its MTP_ARGS (PP 2 with --decoder-last-pipeline-num-layers 23, CP 2)."""
    from tests.unit.test_slime_flags import SLIME_RUNS

    mtp = ["--mtp-num-layers", "1", "--enable-mtp-training", "--mtp-loss-scaling-factor", "0.2"]
    return [*SLIME_MODEL_FILES["glm4.7-flash"], "--hf-checkpoint", str(hf), *SLIME_RUNS["glm4.7-flash"], *mtp]


def test_slime_glm47_flash_mtp_run_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """GLM-4.7-Flash (glm4_moe_lite) trains its MTP layer as slime's script asks, on its published config.json, at
    the script's PP 2 x CP 2 layout: the dry run passes, and the model gets the script's uneven pipeline split (24
    layers, then 23 and the MTP layer on the last stage)."""
    glm = write_reference_config("glm4.7-flash", tmp_path / "glm")
    args = parse_args(_glm47_flash_run(glm))
    assert (args.pipeline_model_parallel_size, args.context_parallel_size) == (2, 2)
    assert mtp_engine_args(args) == {"mtp_layers": 1, "mtp_loss_scaling_factor": 0.2}
    assert model_config_overrides(args, True, True)["num_layers_in_last_pipeline_stage"] == 23
    with pytest.raises(SystemExit) as exit_:
        parse_args([*_glm47_flash_run(glm), "--dry-run"])
    assert exit_.value.code == 0 and "dry run: OK" in capsys.readouterr().out
