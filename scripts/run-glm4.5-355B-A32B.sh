#!/usr/bin/env bash
# GSPO on GLM-4.5 / 4.6 / 4.7 355B-A32B (MoE), 8 nodes of 8 GPUs, colocated: the layout of slime's
# scripts/run-glm4.7-355B-A32B.sh (TP 8 with sequence parallel, PP 4, CP 2, EP 16; engines of 32 GPUs with DP
# attention). --rollout-num-gpus is left out: colocated, the engines take the trainer's 64 GPUs, as in slime.
# Head node:   MASTER_ADDR=<head ip> HF_CHECKPOINT=... PROMPT_DATA=... bash scripts/run-glm4.5-355B-A32B.sh
# Other nodes: python -m ray.scripts.scripts start --address <head ip>:6379 --num-gpus 8   (before the head submits)
#   DRY_RUN=1 ... prints the placement and memory plan and starts nothing.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/launch.sh"
source "$SCRIPTS_DIR/models/glm4.5-355B-A32B.sh"

CKPT_ARGS=(--hf-checkpoint "${HF_CHECKPOINT:-/root/GLM-4.7-355B-A32B}" --save "${SAVE_DIR:-/root/ckpt/glm4.7-355B-gspo}" --save-interval 20)
DATA_ARGS=(--prompt-data "${PROMPT_DATA:-/root/data/train.jsonl}" --input-key prompt --label-key label --apply-chat-template --rollout-shuffle
           --rollout-batch-size 128 --n-samples-per-prompt 8 --over-sampling-batch-size 256 --num-steps-per-rollout 4 --balance-data
           --dynamic-sampling-filter-path slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std)
ROLLOUT_ARGS=(--rollout-num-gpus-per-engine 32 --rollout-max-response-len 32768 --rollout-temperature 1 --rm-type deepscaler
              --rollout-stop-token-ids 151329 151336 151338
              --sglang-mem-fraction-static 0.7 --sglang-enable-dp-attention --sglang-dp-size 4 --sglang-ep-size 32
              --sglang-enable-dp-lm-head --sglang-moe-dense-tp-size 1)
PERF_ARGS=(--actor-num-nodes "${ACTOR_NUM_NODES:-8}" --actor-num-gpus-per-node 8 --colocate
           --tensor-model-parallel-size 8 --sequence-parallel --pipeline-model-parallel-size 4 --context-parallel-size 2
           --expert-model-parallel-size 16 --expert-tensor-parallel-size 1
           --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
           --use-dynamic-batch-size --max-tokens-per-gpu 16384 --use-distributed-optimizer --bf16)
ALGO_ARGS=(--advantage-estimator gspo --kl-loss-coef 0.00 --kl-loss-type low_var_kl --kl-coef 0.00 --entropy-coef 0.00
           --eps-clip 1e-4 --eps-clip-high 2e-4 --use-tis)
OPTIM_ARGS=(--optimizer adam --lr 1e-6 --lr-decay-style constant --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.98
            --optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d --use-precision-aware-optimizer)
MISC_ARGS=(--attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32 --attention-softmax-in-fp32)
CLUSTER_ARGS=(--num-nodes "${NUM_NODES:-8}" --num-gpus-per-node "${GPUS_PER_NODE:-8}" --gpu-memory-gb "${GPU_MEMORY_GB:-80}")
LOG_ARGS=(--output-dir "${OUTPUT_DIR:-outputs/glm4.7-355B-gspo}")

run_job slime_like.train --num-rollout 3000 "${MODEL_ARGS[@]}" "${CKPT_ARGS[@]}" "${DATA_ARGS[@]}" \
  "${ROLLOUT_ARGS[@]}" "${PERF_ARGS[@]}" "${ALGO_ARGS[@]}" "${OPTIM_ARGS[@]}" "${MISC_ARGS[@]}" \
  "${CLUSTER_ARGS[@]}" "${LOG_ARGS[@]}" "$@"
