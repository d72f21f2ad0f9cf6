"""slime's on-policy distillation examples (examples/on_policy_distillation/run-qwen3-8B-opd.sh and
run-qwen3-8B-opd-megatron.sh) parse and dry-run here with their flags as written; a real OPD run on this CPU is
scripts/run-distill-smollm2-cpu.sh (docs/distillation.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slime_like.arguments import parse_args
from tools.reference_configs import write_reference_config

OPD = "slime.rollout.on_policy_distillation"

# slime's scripts/models/qwen3-8B.sh
QWEN3_8B = ["--swiglu", "--num-layers", "36", "--hidden-size", "4096", "--ffn-hidden-size", "12288",
            "--num-attention-heads", "32", "--group-query-attention", "--num-query-groups", "8",
            "--use-rotary-position-embeddings", "--disable-bias-linear", "--normalization", "RMSNorm",
            "--norm-epsilon", "1e-6", "--rotary-base", "1000000", "--vocab-size", "151936", "--kv-channels", "128",
            "--qk-layernorm", "--untie-embeddings-and-output-weights"]  # fmt: skip

# The argument groups both examples share (checkpoint paths left to their own tests; --save is written by a run).
COMMON = [
    # ROLLOUT_ARGS
    "--prompt-data", "dapo-math-17k.jsonl", "--input-key", "prompt", "--apply-chat-template", "--rollout-shuffle",
    "--num-rollout", "300", "--rollout-batch-size", "16", "--n-samples-per-prompt", "4",
    "--rollout-max-response-len", "16384", "--rollout-temperature", "1", "--global-batch-size", "64",
    "--balance-data",
    # PERF_ARGS
    "--tensor-model-parallel-size", "2", "--sequence-parallel", "--pipeline-model-parallel-size", "1",
    "--context-parallel-size", "1", "--expert-model-parallel-size", "1", "--expert-tensor-parallel-size", "1",
    "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
    "--use-dynamic-batch-size", "--max-tokens-per-gpu", "16384",
    # OPTIMIZER_ARGS
    "--optimizer", "adam", "--lr", "1e-6", "--lr-decay-style", "constant", "--weight-decay", "0.1",
    "--adam-beta1", "0.9", "--adam-beta2", "0.98",
    # SGLANG_ARGS
    "--rollout-num-gpus-per-engine", "1", "--sglang-mem-fraction-static", "0.4",
    # MISC_ARGS
    "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--accumulate-allreduce-grads-in-fp32",
    "--attention-softmax-in-fp32", "--attention-backend", "flash",
    # ray job submit ... train.py
    "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "4",
    # Not in the scripts: they keep Qwen3-8B's whole Adam state on each of their 2 training GPUs (TP 2, DP 1), about
    # 107 GiB by the plan (slime_like/planner.py), which an 80 GiB GPU refuses at a dry run; H200-sized GPUs hold it.
    "--gpu-memory-gb", "141",
]  # fmt: skip
# GRPO_ARGS after the OPD flags, in both.
KL_ARGS = ["--use-kl-loss", "--kl-loss-coef", "0.00", "--kl-loss-type", "low_var_kl", "--entropy-coef", "0.00"]


def sglang_teacher(teacher_url: str) -> list[str]:
    """run-qwen3-8B-opd.sh: the teacher (Qwen3-32B) served by an SGLang server the script starts on port 13141."""
    return [*COMMON,
            "--custom-rm-path", f"{OPD}.reward_func", "--custom-reward-post-process-path",
            f"{OPD}.post_process_rewards", "--rm-url", teacher_url,
            "--advantage-estimator", "grpo", "--use-opd", "--opd-type", "sglang", "--opd-kl-coef", "1.0", *KL_ARGS]  # fmt: skip


def megatron_teacher(teacher_load: str) -> list[str]:
    """run-qwen3-8B-opd-megatron.sh: a frozen teacher of the policy's architecture inside the trainer."""
    return [*COMMON, "--rm-type", "math",
            "--advantage-estimator", "grpo", "--use-opd", "--opd-type", "megatron", "--opd-kl-coef", "1.0",
            "--opd-teacher-load", teacher_load, *KL_ARGS]  # fmt: skip


@pytest.fixture(scope="module")
def qwen3_8b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_reference_config("qwen3-8B", tmp_path_factory.mktemp("qwen3-8B"))


@pytest.mark.parametrize("example", ["opd", "opd-megatron"])
def test_slime_opd_example_parses_and_dry_runs(
    example: str, qwen3_8b: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if example == "opd":
        flags = sglang_teacher("http://127.0.0.1:13141/generate")
    else:
        (tmp_path / "Qwen3-8B_torch_dist").mkdir()  # the script's --opd-teacher-load (its own directory exists)
        flags = megatron_teacher(str(tmp_path / "Qwen3-8B_torch_dist"))
    argv = [*QWEN3_8B, "--hf-checkpoint", str(qwen3_8b), *flags]
    args = parse_args(argv)
    assert args.use_opd and args.opd_kl_coef == 1.0 and args.advantage_estimator == "grpo"
    if example == "opd":
        assert args.opd_type == "sglang" and args.rm_url == "http://127.0.0.1:13141/generate"
        assert args.custom_rm_path == f"{OPD}.reward_func"
        assert args.custom_reward_post_process_path == f"{OPD}.post_process_rewards"
    else:
        assert args.opd_type == "megatron" and args.opd_teacher_load == str(tmp_path / "Qwen3-8B_torch_dist")
        assert args.rm_type == "math"
    assert args.global_batch_size == 64 and args.rollout_num_gpus == 4 and args.world_size == 2
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv + ["--dry-run"])
    out = capsys.readouterr()
    assert exit_.value.code == 0, out.out + out.err
    assert "dry run: OK, nothing started" in out.out


def test_opd_example_without_its_teacher_url_names_the_flag(qwen3_8b: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """slime's sglang example with its RM_ARGS' --rm-url left out: the run would score nothing."""
    flags = sglang_teacher("x")
    del flags[flags.index("--rm-url") : flags.index("--rm-url") + 2]
    with pytest.raises(SystemExit):
        parse_args([*QWEN3_8B, "--hf-checkpoint", str(qwen3_8b), *flags, "--dry-run"])
    assert f"--custom-rm-path {OPD}.reward_func asks the teacher for its log-probs at --rm-url: set --rm-url" in (
        capsys.readouterr().err
    )
