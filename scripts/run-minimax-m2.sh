#!/usr/bin/env bash
# GRPO on MiniMax-M2 / M2.5 (229B-A10B MoE), 16 nodes of 8 GPUs, colocated: the layout of slime's
# scripts/run-minimax-m2.sh (TP 2 with sequence parallel, PP 2; engines of 16 GPUs with EP 16), but EP 16 instead of
# slime's EP 4, whose 28B expert parameters per rank need ~175 GiB (fp32 gradients): EP 16 fits 80 GB GPUs.
# Tensor parallel is at most 8 (num_key_value_heads): MiniMax-M2's QK norm spans all key heads.
# --hf-checkpoint must hold 16-bit weights: the published checkpoint is FP8 (dequantize it first, e.g. with slime's
# tools/fp8_cast_bf16.py). --rollout-num-gpus is left out: colocated, the engines take the trainer's 128 GPUs.
# Head node:   MASTER_ADDR=<head ip> HF_CHECKPOINT=... PROMPT_DATA=... bash scripts/run-minimax-m2.sh
# Other nodes: python -m ray.scripts.scripts start --address <head ip>:6379 --num-gpus 8   (before the head submits)
#   DRY_RUN=1 ... prints the placement and memory plan and starts nothing.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/launch.sh"
source "$SCRIPTS_DIR/models/minimax-m2.sh"

CKPT_ARGS=(--hf-checkpoint "${HF_CHECKPOINT:-/root/MiniMax-M2.5-bf16}" --save "${SAVE_DIR:-/root/ckpt/minimax-m2-grpo}" --save-interval 20)
DATA_ARGS=(--prompt-data "${PROMPT_DATA:-/root/data/train.jsonl}" --input-key prompt --label-key label --apply-chat-template --rollout-shuffle
           --rollout-batch-size 128 --n-samples-per-prompt 8 --over-sampling-batch-size 256 --num-steps-per-rollout 4 --balance-data
           --dynamic-sampling-filter-path slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std)
ROLLOUT_ARGS=(--rollout-num-gpus-per-engine 16 --rollout-max-response-len 32768 --rollout-temperature 1 --rm-type deepscaler
              --sglang-mem-fraction-static 0.7 --sglang-ep-size 16)
PERF_ARGS=(--actor-num-nodes "${ACTOR_NUM_NODES:-16}" --actor-num-gpus-per-node 8 --colocate
           --tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 2 --context-parallel-size 1
           --expert-model-parallel-size 16 --expert-tensor-parallel-size 1
           --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
           --use-dynamic-batch-size --max-tokens-per-gpu 8192 --use-distributed-optimizer --bf16)
ALGO_ARGS=(--advantage-estimator grpo --use-kl-loss --kl-loss-coef 0.00 --kl-loss-type low_var_kl --entropy-coef 0.00
           --eps-clip 0.2 --eps-clip-high 0.28)
OPTIM_ARGS=(--optimizer adam --lr 1e-6 --lr-decay-style constant --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.98
            --optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d --use-precision-aware-optimizer)
MISC_ARGS=(--attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32 --attention-softmax-in-fp32)
CLUSTER_ARGS=(--num-nodes "${NUM_NODES:-16}" --num-gpus-per-node "${GPUS_PER_NODE:-8}" --gpu-memory-gb "${GPU_MEMORY_GB:-80}")
LOG_ARGS=(--output-dir "${OUTPUT_DIR:-outputs/minimax-m2-grpo}")

run_job slime_like.train --num-rollout 3000 "${MODEL_ARGS[@]}" "${CKPT_ARGS[@]}" "${DATA_ARGS[@]}" \
  "${ROLLOUT_ARGS[@]}" "${PERF_ARGS[@]}" "${ALGO_ARGS[@]}" "${OPTIM_ARGS[@]}" "${MISC_ARGS[@]}" \
  "${CLUSTER_ARGS[@]}" "${LOG_ARGS[@]}" "$@"
