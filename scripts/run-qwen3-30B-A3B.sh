#!/usr/bin/env bash
# GRPO on Qwen3-30B-A3B (MoE), two nodes of 8 GPUs, colocated; expert parallel 8.
# Head node:   MASTER_ADDR=<head ip> HF_CHECKPOINT=... PROMPT_DATA=... bash scripts/run-qwen3-30B-A3B.sh
# Other node:  python -m ray.scripts.scripts start --address <head ip>:6379 --num-gpus 8   (before the head submits)
#   DRY_RUN=1 ... prints the placement and memory plan and starts nothing.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/launch.sh"
source "$SCRIPTS_DIR/models/qwen3-30B-A3B.sh"

CKPT_ARGS=(--hf-checkpoint "${HF_CHECKPOINT:-/root/Qwen3-30B-A3B}" --save "${SAVE_DIR:-/root/ckpt/qwen3-30B-A3B-grpo}" --save-interval 20)
DATA_ARGS=(--prompt-data "${PROMPT_DATA:-/root/data/train.jsonl}" --input-key prompt --label-key label --apply-chat-template --rollout-shuffle
           --rollout-batch-size 32 --n-samples-per-prompt 8)
ROLLOUT_ARGS=(--rollout-num-gpus 16 --rollout-num-gpus-per-engine 8 --rollout-max-response-len 8192
              --rollout-temperature 1.0 --rm-type math --sglang-mem-fraction-static 0.7)
PERF_ARGS=(--actor-num-nodes 2 --actor-num-gpus-per-node 8 --colocate
           --tensor-model-parallel-size 4 --sequence-parallel --pipeline-model-parallel-size 2 --context-parallel-size 1
           --expert-model-parallel-size 8 --expert-tensor-parallel-size 1
           --max-tokens-per-gpu 8192 --use-distributed-optimizer --bf16)
ALGO_ARGS=(--advantage-estimator grpo --eps-clip 0.2 --eps-clip-high 0.28)
OPTIM_ARGS=(--lr 1e-6 --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.98 --clip-grad 1.0)
CLUSTER_ARGS=(--num-nodes "${NUM_NODES:-2}" --num-gpus-per-node "${GPUS_PER_NODE:-8}" --gpu-memory-gb "${GPU_MEMORY_GB:-80}")
LOG_ARGS=(--output-dir "${OUTPUT_DIR:-outputs/qwen3-30B-A3B-grpo}")

run_job slime_like.train --num-rollout 3000 "${MODEL_ARGS[@]}" "${CKPT_ARGS[@]}" "${DATA_ARGS[@]}" \
  "${ROLLOUT_ARGS[@]}" "${PERF_ARGS[@]}" "${ALGO_ARGS[@]}" "${OPTIM_ARGS[@]}" "${CLUSTER_ARGS[@]}" \
  "${LOG_ARGS[@]}" "$@"
