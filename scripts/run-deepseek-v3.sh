#!/usr/bin/env bash
# GRPO on DeepSeek-V3 (671B MoE, MLA), 32 nodes of 8 GPUs, colocated. 61 layers over 8 pipeline
# stages: 7 on the first, 6 on the last, 8 on each of the six in between.
# Head node:   MASTER_ADDR=<head ip> HF_CHECKPOINT=... PROMPT_DATA=... bash scripts/run-deepseek-v3.sh
# Other nodes: python -m ray.scripts.scripts start --address <head ip>:6379 --num-gpus 8   (before the head submits)
#   DRY_RUN=1 ... prints the placement and memory plan and starts nothing.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/launch.sh"
source "$SCRIPTS_DIR/models/deepseek-v3.sh"

CKPT_ARGS=(--hf-checkpoint "${HF_CHECKPOINT:-/root/DeepSeek-V3}" --save "${SAVE_DIR:-/root/ckpt/deepseek-v3-grpo}" --save-interval 20)
DATA_ARGS=(--prompt-data "${PROMPT_DATA:-/root/data/train.jsonl}" --input-key prompt --label-key label --apply-chat-template --rollout-shuffle
           --rollout-batch-size 128 --n-samples-per-prompt 8)
ROLLOUT_ARGS=(--rollout-num-gpus 256 --rollout-num-gpus-per-engine 32 --rollout-max-response-len 16384
              --rollout-temperature 1.0 --rm-type math --sglang-mem-fraction-static 0.7)
PERF_ARGS=(--actor-num-nodes 32 --actor-num-gpus-per-node 8 --colocate
           --tensor-model-parallel-size 8 --sequence-parallel --pipeline-model-parallel-size 8
           --decoder-first-pipeline-num-layers 7 --decoder-last-pipeline-num-layers 6
           --expert-model-parallel-size 32 --expert-tensor-parallel-size 1
           --max-tokens-per-gpu 16384 --use-distributed-optimizer --bf16)
ALGO_ARGS=(--advantage-estimator grpo --eps-clip 0.2 --eps-clip-high 0.28)
OPTIM_ARGS=(--lr 1e-6 --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.98 --clip-grad 1.0)
CLUSTER_ARGS=(--num-nodes "${NUM_NODES:-32}" --num-gpus-per-node "${GPUS_PER_NODE:-8}" --gpu-memory-gb "${GPU_MEMORY_GB:-80}")
LOG_ARGS=(--output-dir "${OUTPUT_DIR:-outputs/deepseek-v3-grpo}")

run_job slime_like.train --num-rollout 3000 "${MODEL_ARGS[@]}" "${CKPT_ARGS[@]}" "${DATA_ARGS[@]}" \
  "${ROLLOUT_ARGS[@]}" "${PERF_ARGS[@]}" "${ALGO_ARGS[@]}" "${OPTIM_ARGS[@]}" "${CLUSTER_ARGS[@]}" \
  "${LOG_ARGS[@]}" "$@"
