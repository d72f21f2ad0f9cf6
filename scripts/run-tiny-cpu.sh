#!/usr/bin/env bash
# The embedded CPU demo: GRPO on a tiny model learning single-digit addition, end to end with
# real SGLang, sglang-router, Ray and Megatron on a 2-core CPU (about 10 minutes).
#   bash scripts/run-tiny-cpu.sh            # everything, set-up included
#   NUM_ROLLOUT=20 bash scripts/run-tiny-cpu.sh   # shorter
#   ASYNC=one-step bash scripts/run-tiny-cpu.sh   # the next rollout generates while this one trains (train_async)
#   ASYNC=fully bash scripts/run-tiny-cpu.sh      # fully asynchronous: generation never waits (docs/fully-async.md)
#   LORA=1 bash scripts/run-tiny-cpu.sh           # train a LoRA adapter on a frozen base (docs/lora.md)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# The loop: synchronous (default), one step ahead, or fully asynchronous; all on the same separate devices.
case "${ASYNC:-}" in
  "") LOOP=(slime_like.train) ;;
  # Stale samples need the off-policy correction: without TIS one step of staleness stopped the learning on
  # scripts/bench/bench_fully_async.py's job (final eval 0.26 against 0.49 with it; sync 0.47).
  one-step) LOOP=(slime_like.train_async --use-tis) ;;
  fully) LOOP=(slime_like.train_async --fully-async --max-weight-staleness 2 --use-tis) ;;
  *) echo "ASYNC=${ASYNC}: choose one-step or fully (or leave it unset for the synchronous loop)" >&2; exit 2 ;;
esac

bash scripts/setup.sh
PY="$ROOT/.venv/bin/python"
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
WORK="${WORK:-$ROOT/outputs/tiny-cpu}"
mkdir -p "$WORK"

# 1. A tiny Qwen3 (4 layers, hidden 128, 0.66M parameters) and the task data, made offline.
[[ -f "$WORK/base/config.json" ]] || "$PY" tools/make_tiny_model.py --out "$WORK/base" \
  --hidden-size 128 --ffn-hidden-size 256 --num-layers 4 --num-heads 4 --num-kv-heads 2 >/dev/null
"$PY" tools/make_demo_data.py --out "$WORK/data" --max-operand 9 >/dev/null
cat "$WORK/data/train.jsonl" "$WORK/data/eval.jsonl" > "$WORK/data/all.jsonl"

# 2. A short supervised warm start through the same Megatron engine (RL from random init stalls).
[[ -f "$WORK/sft/model.safetensors" ]] || "$PY" tools/sft_warmstart.py --hf-checkpoint "$WORK/base" \
  --data "$WORK/data/sft.jsonl" --out "$WORK/sft" --steps 60 2>&1 | grep -E '^\[sft|^/'

# 3. GRPO. Argument groups as in every launch script; edit them freely.
CKPT_ARGS=(--hf-checkpoint "$WORK/sft" --save "$WORK/ckpt" --save-interval 1000)
DATA_ARGS=(--prompt-data "$WORK/data/train.jsonl" --input-key prompt --label-key label --rollout-shuffle
           --rollout-batch-size 32 --n-samples-per-prompt 8)
ROLLOUT_ARGS=(--rollout-temperature 1.0 --rollout-max-response-len 4 --rollout-stop-token-ids 2
              --rollout-num-gpus 1 --rm-type math)
EVAL_ARGS=(--eval-prompt-data "$WORK/data/all.jsonl" --eval-interval 10 --eval-temperature 0)
PERF_ARGS=(--actor-num-nodes 1 --actor-num-gpus-per-node 1 --max-tokens-per-gpu 512)
ALGO_ARGS=(--advantage-estimator grpo --eps-clip 0.2)
OPTIM_ARGS=(--lr 3e-4 --clip-grad 1.0)
# LoRA: rank 16 on every linear layer; the adapter needs a larger step than full weights (docs/lora.md).
if [[ "${LORA:-0}" != 0 ]]; then
  OPTIM_ARGS=(--lora-rank 16 --lora-alpha 32 --target-modules all-linear --lr "${LORA_LR:-2e-3}" --clip-grad 1.0)
fi
LOG_ARGS=(--output-dir "$WORK/run")

rm -rf "$WORK/run" "$WORK/ckpt"
"$PY" -m "${LOOP[@]}" --num-rollout "${NUM_ROLLOUT:-100}" \
  "${CKPT_ARGS[@]}" "${DATA_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${EVAL_ARGS[@]}" \
  "${PERF_ARGS[@]}" "${ALGO_ARGS[@]}" "${OPTIM_ARGS[@]}" "${LOG_ARGS[@]}" "$@"
"$PY" - "$WORK/run/metrics.jsonl" <<'PYEOF'
import json, sys
evals = [(r["step"], r["eval/reward_mean"]) for r in map(json.loads, open(sys.argv[1])) if "eval/reward_mean" in r]
print(f"eval reward (greedy accuracy on all 100 problems): {evals[0][1]:.2f} at step {evals[0][0]} -> "
      f"{evals[-1][1]:.2f} at step {evals[-1][0]}")
PYEOF
