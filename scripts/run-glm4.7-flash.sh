#!/usr/bin/env bash
# GRPO on GLM-4.7-Flash (30B-A3B MoE with multi-latent attention), one node of 8 GPUs, colocated: the layout of
# slime's scripts/run-glm4.7-30B-A3B.sh (TP 2 with sequence parallel, PP 2, CP 2; engines of 8 GPUs with DP
# attention), but EP 4: slime's EP 8 x PP 2 needs 16 trainer ranks (Megatron refuses it on 8).
# --rollout-num-gpus is left out: colocated, the engines take the trainer's 8 GPUs, as in slime.
#   HF_CHECKPOINT=... PROMPT_DATA=... bash scripts/run-glm4.7-flash.sh
#   DRY_RUN=1 ... prints the placement and memory plan and starts nothing; ENABLE_MTP=1 ... trains the MTP layer.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/launch.sh"
source "$SCRIPTS_DIR/models/glm4.7-flash.sh"

CKPT_ARGS=(--hf-checkpoint "${HF_CHECKPOINT:-/root/GLM-4.7-Flash}" --save "${SAVE_DIR:-/root/ckpt/glm4.7-flash-grpo}" --save-interval 20)
DATA_ARGS=(--prompt-data "${PROMPT_DATA:-/root/data/train.jsonl}" --input-key prompt --label-key label --apply-chat-template --rollout-shuffle
           --rollout-batch-size 128 --n-samples-per-prompt 8 --global-batch-size 1024)
ROLLOUT_ARGS=(--rollout-num-gpus-per-engine 8 --rollout-max-response-len 32768 --rollout-temperature 1.0 --rm-type deepscaler
              --sglang-mem-fraction-static 0.8 --sglang-enable-dp-attention --sglang-dp-size 8 --sglang-enable-dp-lm-head
              --sglang-moe-dense-tp-size 1 --sglang-max-running-requests 512)
# ENABLE_MTP=1: slime's MTP_ARGS and EAGLE serving: the MTP layer (on the last pipeline stage) is trained as the
# speculative draft, at the same PP 2 x CP 2 layout (docs/models.md, "MTP training").
LAYOUT_ARGS=(--pipeline-model-parallel-size 2 --context-parallel-size 2 --expert-model-parallel-size 4
             --decoder-last-pipeline-num-layers 23)
if [[ "${ENABLE_MTP:-0}" == 1 ]]; then
  MTP_ARGS=(--mtp-num-layers 1 --enable-mtp-training --mtp-loss-scaling-factor 0.2
            --sglang-speculative-algorithm EAGLE --sglang-speculative-num-steps 3 --sglang-speculative-eagle-topk 1
            --sglang-speculative-num-draft-tokens 4)
else
  MTP_ARGS=()
fi
PERF_ARGS=(--actor-num-nodes 1 --actor-num-gpus-per-node 8 --colocate
           --tensor-model-parallel-size 2 --sequence-parallel "${LAYOUT_ARGS[@]}" --expert-tensor-parallel-size 1
           --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
           --use-dynamic-batch-size --max-tokens-per-gpu 32768 --use-distributed-optimizer --bf16)
ALGO_ARGS=(--advantage-estimator grpo --use-kl-loss --kl-loss-coef 0.00 --kl-loss-type low_var_kl --entropy-coef 0.00)
OPTIM_ARGS=(--optimizer adam --lr 1e-6 --lr-decay-style constant --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.98
            --optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d --use-precision-aware-optimizer)
MISC_ARGS=(--attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32 --attention-softmax-in-fp32)
CLUSTER_ARGS=(--num-nodes "${NUM_NODES:-1}" --num-gpus-per-node "${GPUS_PER_NODE:-8}" --gpu-memory-gb "${GPU_MEMORY_GB:-80}")
LOG_ARGS=(--output-dir "${OUTPUT_DIR:-outputs/glm4.7-flash-grpo}")

run_job slime_like.train --num-rollout 3000 "${MODEL_ARGS[@]}" "${CKPT_ARGS[@]}" "${DATA_ARGS[@]}" \
  "${ROLLOUT_ARGS[@]}" "${PERF_ARGS[@]}" "${ALGO_ARGS[@]}" "${OPTIM_ARGS[@]}" "${MISC_ARGS[@]}" \
  "${CLUSTER_ARGS[@]}" "${LOG_ARGS[@]}" "${MTP_ARGS[@]}" "$@"
