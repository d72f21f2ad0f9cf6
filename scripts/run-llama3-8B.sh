#!/usr/bin/env bash
# GRPO on Llama-3-8B, one node of 8 GPUs, training and rollout colocated.
#   HF_CHECKPOINT=/models/Llama-3-8B PROMPT_DATA=/data/dapo-math-17k.jsonl bash scripts/run-llama3-8B.sh
#   DRY_RUN=1 ... prints the placement and memory plan and starts nothing.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/launch.sh"
source "$SCRIPTS_DIR/models/llama3-8B.sh"

CKPT_ARGS=(--hf-checkpoint "${HF_CHECKPOINT:-/root/Llama-3-8B}" --save "${SAVE_DIR:-/root/ckpt/llama3-8B-grpo}" --save-interval 20)
DATA_ARGS=(--prompt-data "${PROMPT_DATA:-/root/data/train.jsonl}" --input-key prompt --label-key label
           --apply-chat-template --rollout-shuffle --rollout-batch-size 32 --n-samples-per-prompt 8)
ROLLOUT_ARGS=(--rollout-num-gpus 8 --rollout-num-gpus-per-engine 2 --rollout-max-response-len 8192
              --rollout-temperature 1.0 --rm-type math --rollout-stop-token-ids 128009 --sglang-mem-fraction-static 0.7)
EVAL_ARGS=()
PERF_ARGS=(--actor-num-nodes 1 --actor-num-gpus-per-node 8 --colocate --tensor-model-parallel-size 2 --sequence-parallel
           --pipeline-model-parallel-size 1 --max-tokens-per-gpu 9216 --use-distributed-optimizer --bf16)
ALGO_ARGS=(--advantage-estimator grpo --eps-clip 0.2 --eps-clip-high 0.28)
OPTIM_ARGS=(--lr 1e-6 --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.98 --clip-grad 1.0)
CLUSTER_ARGS=(--num-gpus-per-node "${GPUS_PER_NODE:-8}" --gpu-memory-gb "${GPU_MEMORY_GB:-80}")
LOG_ARGS=(--output-dir "${OUTPUT_DIR:-outputs/llama3-8B-grpo}")

run_job slime_like.train --num-rollout 3000 "${MODEL_ARGS[@]}" "${CKPT_ARGS[@]}" "${DATA_ARGS[@]}" \
  "${ROLLOUT_ARGS[@]}" "${EVAL_ARGS[@]}" "${PERF_ARGS[@]}" "${ALGO_ARGS[@]}" "${OPTIM_ARGS[@]}" \
  "${CLUSTER_ARGS[@]}" "${LOG_ARGS[@]}" "$@"
