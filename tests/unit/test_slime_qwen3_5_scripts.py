"""slime's Qwen3.5 launch scripts pass our start-up checks with their flags as written, against the published
config.json of their models (tools/reference_configs.py): scripts/run-qwen3.5-27B.sh,
scripts/run-qwen3.5-35B-A3B-sft.sh and examples/fully_async/run-qwen3.5-9B-fully_async.sh.

Qwen3.5 nests its language model under text_config; the planner used to read the outer config and stop with
"'Qwen3_5Config' object has no attribute 'num_attention_heads'". The model files (scripts/models/qwen3.5-*.sh) are
test_slime_flags.SLIME_MODEL_FILES; checkpoint paths (--ref-load, --load, --save) are left out as there.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slime_like.arguments import parse_args
from tests.unit.test_slime_flags import SLIME_MODEL_FILES
from tools.reference_configs import write_reference_config

# scripts/run-qwen3.5-27B.sh with its defaults (ACTOR_NUM_NODES=4, ACTOR_NUM_GPUS_PER_NODE=8, CP_SIZE=4).
RUN_27B = [
    "--actor-num-nodes", "4", "--actor-num-gpus-per-node", "8", "--colocate",
    "--prompt-data", "dapo-math-17k.jsonl", "--input-key", "prompt", "--label-key", "label",
    "--apply-chat-template", "--rollout-shuffle", "--rm-type", "deepscaler", "--num-rollout", "3000",
    "--rollout-batch-size", "8", "--n-samples-per-prompt", "8", "--rollout-max-response-len", "32768",
    "--rollout-temperature", "1.0", "--global-batch-size", "64", "--balance-data",
    "--optimizer", "adam", "--lr", "1e-6", "--lr-decay-style", "constant", "--weight-decay", "0.1",
    "--adam-beta1", "0.9", "--adam-beta2", "0.98", "--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d",
    "--use-precision-aware-optimizer",
    "--advantage-estimator", "grpo", "--kl-loss-coef", "0.00", "--kl-loss-type", "low_var_kl", "--kl-coef", "0.00",
    "--entropy-coef", "0.00", "--eps-clip", "0.2",
    "--tensor-model-parallel-size", "4", "--sequence-parallel", "--pipeline-model-parallel-size", "2",
    "--decoder-last-pipeline-num-layers", "30", "--context-parallel-size", "4", "--expert-model-parallel-size", "1",
    "--expert-tensor-parallel-size", "1", "--recompute-granularity", "full", "--recompute-method", "uniform",
    "--recompute-num-layers", "1", "--use-dynamic-batch-size", "--calculate-per-token-loss",
    "--max-tokens-per-gpu", "8192",
    "--eval-interval", "20", "--eval-prompt-data", "aime", "aime-2024.jsonl", "--n-samples-per-eval-prompt", "8",
    "--eval-max-response-len", "32768", "--eval-top-p", "1",
    "--rollout-num-gpus-per-engine", "2", "--sglang-mem-fraction-static", "0.75",
    "--sglang-speculative-algorithm", "EAGLE", "--sglang-speculative-num-steps", "3",
    "--sglang-speculative-eagle-topk", "1", "--sglang-speculative-num-draft-tokens", "4",
    "--sglang-mamba-scheduler-strategy", "extra_buffer",
    "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--accumulate-allreduce-grads-in-fp32",
    "--attention-softmax-in-fp32", "--attention-backend", "flash",
]  # fmt: skip

# scripts/run-qwen3.5-35B-A3B-sft.sh: SFT with --debug-train-only (no SGLang engine), on train_async.py.
RUN_35B_A3B_SFT = [
    "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "8",
    "--rollout-function-path", "slime.rollout.sft_rollout.generate_rollout",
    "--prompt-data", "{prompts}", "--input-key", "messages", "--rollout-shuffle", "--num-epoch", "3",
    "--rollout-batch-size", "128", "--global-batch-size", "128", "--loss-type", "sft_loss",
    "--loss-mask-type", "qwen3_5", "--calculate-per-token-loss", "--disable-compute-advantages-and-returns",
    "--debug-train-only",
    "--optimizer", "adam", "--lr", "1e-5", "--lr-decay-style", "cosine", "--min-lr", "1e-6",
    "--lr-warmup-fraction", "0.1", "--weight-decay", "0.1", "--adam-beta1", "0.9", "--adam-beta2", "0.98",
    "--use-distributed-optimizer", "--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d",
    "--use-precision-aware-optimizer",
    "--tensor-model-parallel-size", "2", "--sequence-parallel", "--pipeline-model-parallel-size", "1",
    "--context-parallel-size", "1", "--expert-model-parallel-size", "8", "--expert-tensor-parallel-size", "1",
    "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
    "--use-dynamic-batch-size", "--max-tokens-per-gpu", "8192",
    "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--accumulate-allreduce-grads-in-fp32",
    "--attention-softmax-in-fp32", "--attention-backend", "flash", "--moe-token-dispatcher-type", "flex",
    "--moe-enable-deepep",
]  # fmt: skip

# examples/fully_async/run-qwen3.5-9B-fully_async.sh with its defaults (NUM_GPUS=8, ACTOR_GPUS=4).
RUN_9B_FULLY_ASYNC = [
    "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "4", "--rollout-num-gpus", "4",
    "--rollout-function-path", "slime.rollout.fully_async_rollout.generate_rollout_fully_async",
    "--prompt-data", "dapo-math-17k.jsonl", "--input-key", "prompt", "--label-key", "label",
    "--apply-chat-template", "--rollout-shuffle", "--rm-type", "deepscaler", "--num-rollout", "3",
    "--rollout-batch-size", "8", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "2048",
    "--rollout-temperature", "1", "--global-batch-size", "32", "--balance-data",
    "--optimizer", "adam", "--lr", "1e-6", "--lr-decay-style", "constant", "--weight-decay", "0.1",
    "--adam-beta1", "0.9", "--adam-beta2", "0.98",
    "--advantage-estimator", "grpo", "--use-kl-loss", "--kl-loss-coef", "0.00", "--kl-loss-type", "low_var_kl",
    "--entropy-coef", "0.00", "--eps-clip", "0.2", "--eps-clip-high", "0.28",
    "--tensor-model-parallel-size", "2", "--sequence-parallel", "--pipeline-model-parallel-size", "1",
    "--context-parallel-size", "1", "--expert-model-parallel-size", "1", "--expert-tensor-parallel-size", "1",
    "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
    "--use-dynamic-batch-size", "--max-tokens-per-gpu", "4096",
    "--rollout-num-gpus-per-engine", "2", "--sglang-mem-fraction-static", "0.7",
    "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--accumulate-allreduce-grads-in-fp32",
    "--attention-softmax-in-fp32", "--attention-backend", "flash",
]  # fmt: skip

# script -> (model, run flags, lines the dry run prints: the parameters transformers counts, the layout)
SCRIPTS = {
    "run-qwen3.5-27B.sh": (
        "qwen3.5-27B",
        RUN_27B,
        ["model: qwen3_5_text, 26.90B parameters (0.00B in routed experts)",
         "32 ranks; TP 4 x PP 2 x CP 4 -> DP 1", "rollout: 32 GPUs = 16 SGLang engine(s) x TP 2"],
    ),
    "run-qwen3.5-35B-A3B-sft.sh": (
        "qwen3.5-35B-A3B",
        RUN_35B_A3B_SFT,
        ["model: qwen3_5_moe_text, 34.66B parameters (32.21B in routed experts)",
         "TP 2 x PP 1 x CP 1 -> DP 4; EP 8", "rollout: no SGLang engine (--debug-train-only"],
    ),
    "run-qwen3.5-9B-fully_async.sh": (
        "qwen3.5-9B",
        RUN_9B_FULLY_ASYNC,
        ["model: qwen3_5_text, 8.95B parameters (0.00B in routed experts)",
         "4 ranks; TP 2 x PP 1 x CP 1 -> DP 2", "rollout: 4 GPUs = 2 SGLang engine(s) x TP 2"],
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def sft_prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Chat data with a messages column (the script's openhermes2_5.parquet), enough for one --rollout-batch-size."""
    path = tmp_path_factory.mktemp("sft") / "openhermes2_5.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]} for i in range(256)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_slime_qwen3_5_script_passes_the_start_up_checks(
    script: str, sft_prompts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, run, lines = SCRIPTS[script]
    hf = write_reference_config(model, tmp_path / model)
    argv = [*SLIME_MODEL_FILES[model], "--hf-checkpoint", str(hf), *[a.format(prompts=sft_prompts) for a in run]]
    with pytest.raises(SystemExit) as exit_:
        parse_args([*argv, "--dry-run"])
    out = capsys.readouterr()
    assert exit_.value.code == 0, out.out + out.err
    assert "dry run: OK, nothing started" in out.out
    for line in lines:
        assert line in out.out, out.out
    args = parse_args(argv)  # a real start: no layout problem, no memory warning
    assert args.plan_warnings == [] and args.sequence_parallel
