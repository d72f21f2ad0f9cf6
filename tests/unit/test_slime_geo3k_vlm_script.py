"""slime's examples/geo3k_vlm/run_geo3k_qwen35.sh against our start-up checks, with Qwen3.5-35B-A3B's published config
(tools/reference_configs.py) and the script's flags as written (scripts/models/qwen3.5-35B-A3B-vl.sh: the text model's
flags with slime's VL model provider as --spec).

The trainer builds Qwen2.5-VL's vision tower only (slime_like/trainer/megatron/families.py: VISION_BUILT); Qwen3.5's
vision path is not built yet, so --multimodal-keys on Qwen3.5 must stop at start with that reason, naming the flag,
the model type and what is built, before Ray or any server starts. Once Qwen3.5's vision path is built (VISION_BUILT
names qwen3_5_moe) the same dry run passes. The script without --multimodal-keys (its text model) passes either way.

The script names no GPU; slime runs it on 8 GPUs without the distributed optimizer, so the planner counts about 83 GiB
per training GPU (fp32 main weights and Adam states of a 35B MoE over TP 2 x EP 8): over an 80 GiB GPU, where a real
start warns and --dry-run reports a memory problem. The dry runs here give the GPU H200's 141 GiB.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slime_like.arguments import parse_args
from slime_like.trainer.megatron.families import VISION_BUILT
from tests.unit.test_slime_flags import SLIME_MODEL_FILES
from tools.reference_configs import write_reference_config

MULTIMODAL_KEYS = ["--multimodal-keys", '{"image": "images"}']
H200 = ["--gpu-memory-gb", "141"]

# run_geo3k_qwen35.sh with its defaults (NUM_GPUS=8); --hf-checkpoint is the reference config, --load left out.
RUN_GEO3K = [
    "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "8",
    "--prompt-data", "/root/datasets/geo3k_imgurl/train.parquet", "--input-key", "problem", "--label-key", "answer",
    "--apply-chat-template", "--rollout-shuffle", "--rm-type", "deepscaler", "--num-rollout", "3000",
    "--rollout-batch-size", "64", "--n-samples-per-prompt", "8", "--rollout-max-response-len", "4096",
    "--rollout-temperature", "0.8", "--global-batch-size", "512",
    "--eval-interval", "20", "--eval-prompt-data", "geo3k_imgurl", "/root/datasets/geo3k_imgurl/test.parquet",
    "--n-samples-per-eval-prompt", "1", "--eval-max-response-len", "4096",
    "--advantage-estimator", "grpo", "--kl-loss-coef", "0.00", "--kl-loss-type", "low_var_kl", "--kl-coef", "0.00",
    "--entropy-coef", "0.00", "--eps-clip", "0.2", "--eps-clip-high", "0.28",
    "--optimizer", "adam", "--lr", "1e-6", "--lr-decay-style", "constant", "--weight-decay", "0.1",
    "--adam-beta1", "0.9", "--adam-beta2", "0.98",
    "--rollout-num-gpus-per-engine", "8", "--sglang-mem-fraction-static", "0.7", "--sglang-ep-size", "8",
    "--sglang-cuda-graph-bs", *[str(b) for b in (1, 2, 4, *range(8, 257, 8))],
    "--sglang-speculative-algorithm", "EAGLE", "--sglang-speculative-num-steps", "2",
    "--sglang-speculative-eagle-topk", "1", "--sglang-speculative-num-draft-tokens", "3",
    "--sglang-max-running-requests", "512",
    "--colocate",
    "--train-backend", "megatron", "--tensor-model-parallel-size", "2", "--sequence-parallel",
    "--pipeline-model-parallel-size", "1", "--context-parallel-size", "1", "--expert-model-parallel-size", "8",
    "--expert-tensor-parallel-size", "1", "--recompute-granularity", "full", "--recompute-method", "uniform",
    "--recompute-num-layers", "1", "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
    "--accumulate-allreduce-grads-in-fp32", "--attention-softmax-in-fp32", "--attention-backend", "flash",
    "--micro-batch-size", "1",
]  # fmt: skip


def vl_model_args() -> list[str]:
    """scripts/models/qwen3.5-35B-A3B-vl.sh: the text model file with MODEL_ARGS[1..2] set to the VL provider."""
    args = list(SLIME_MODEL_FILES["qwen3.5-35B-A3B"])
    assert args[0] == "--spec"
    args[1:3] = ["slime_plugins.models.qwen3_5_vl", "get_qwen3_5_vl_model_provider"]
    return args


@pytest.fixture(scope="module")
def qwen3_5_35b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_reference_config("qwen3.5-35B-A3B", tmp_path_factory.mktemp("configs") / "qwen3.5-35B-A3B")


def _dry_run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        parse_args([*argv, "--dry-run"])
    out = capsys.readouterr()
    return int(exit_.value.code or 0), out.out, out.err


def test_geo3k_qwen35_with_images_is_refused_naming_the_vision_path(
    qwen3_5_35b: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*vl_model_args(), "--hf-checkpoint", str(qwen3_5_35b), *MULTIMODAL_KEYS, *RUN_GEO3K, *H200]
    code, out, err = _dry_run(argv, capsys)
    if "qwen3_5_moe" in VISION_BUILT:  # Qwen3.5's vision path has landed: the script starts as written
        assert code == 0 and "dry run: OK, nothing started" in out, out + err
        return
    assert code == 2, out + err
    assert "dry run: OK" not in out
    assert f"--multimodal-keys with --hf-checkpoint {qwen3_5_35b}: model_type 'qwen3_5_moe': its vision" in err, err
    assert f"the trainer's vision path is built for {', '.join(VISION_BUILT)}" in err
    assert "drop --multimodal-keys to train on text" in err


def test_geo3k_qwen35_text_model_passes_the_other_checks(qwen3_5_35b: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --multimodal-keys the same flags and config pass: the vision refusal is the only stop."""
    argv = [*vl_model_args(), "--hf-checkpoint", str(qwen3_5_35b), *RUN_GEO3K]
    code, out, err = _dry_run([*argv, *H200], capsys)
    assert code == 0, out + err
    assert "dry run: OK, nothing started" in out
    assert "34.66B parameters" in out and "TP 2 x PP 1 x CP 1 -> DP 4; EP 8" in out, out
    args = parse_args(argv)  # a real start on 80 GiB GPUs: it starts, warning about the memory
    assert len(args.plan_warnings) == 1 and "83.1 GiB" in args.plan_warnings[0], args.plan_warnings
