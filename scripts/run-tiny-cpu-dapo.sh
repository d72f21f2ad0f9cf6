#!/usr/bin/env bash
# DAPO recipe on the CPU demo task: GRPO + clip-higher + dynamic sampling + overlong penalty + token-level loss
# (Yu et al., 2025). Same tiny model, data and SFT warm start as scripts/run-tiny-cpu.sh (made if missing).
#   NUM_ROLLOUT=40 bash scripts/run-tiny-cpu-dapo.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
PY="$ROOT/.venv/bin/python"
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
WORK="${WORK:-$ROOT/outputs/tiny-cpu}"
RUN="${RUN:-$WORK/run-dapo}"
mkdir -p "$WORK"

# 1-2. The tiny model, the task data and the SFT warm start, shared with run-tiny-cpu.sh.
[[ -f "$WORK/base/config.json" ]] || "$PY" tools/make_tiny_model.py --out "$WORK/base" \
  --hidden-size 128 --ffn-hidden-size 256 --num-layers 4 --num-heads 4 --num-kv-heads 2 >/dev/null
[[ -f "$WORK/data/train.jsonl" ]] || "$PY" tools/make_demo_data.py --out "$WORK/data" --max-operand 9 >/dev/null
cat "$WORK/data/train.jsonl" "$WORK/data/eval.jsonl" > "$WORK/data/all.jsonl"
[[ -f "$WORK/sft/model.safetensors" ]] || "$PY" tools/sft_warmstart.py --hf-checkpoint "$WORK/base" \
  --data "$WORK/data/sft.jsonl" --out "$WORK/sft" --steps 60 2>&1 | grep -E '^\[sft|^/'

# 3. GRPO with DAPO's pieces. Responses are at most 3 tokens (two digits and the end token), so a one-token
# overlong buffer penalises exactly the responses cut at the 4-token budget.
CKPT_ARGS=(--hf-checkpoint "$WORK/sft")
DATA_ARGS=(--prompt-data "$WORK/data/train.jsonl" --input-key prompt --label-key label --rollout-shuffle
           --rollout-batch-size 32 --n-samples-per-prompt 8)
ROLLOUT_ARGS=(--rollout-temperature 1.0 --rollout-max-response-len 4 --rollout-stop-token-ids 2
              --rollout-num-gpus 1 --rm-type math)
DAPO_ARGS=(--dynamic-sampling-filter-path rollout.filters.check_reward_nonzero_std  # dynamic sampling
           --over-sampling-batch-size 48
           --eps-clip 0.2 --eps-clip-high 0.28                                       # clip-higher
           --loss-agg-mode token-mean                                                # token-level loss
           --overlong-buffer-len 1 --overlong-penalty-factor 1.0)                     # overlong shaping
EVAL_ARGS=(--eval-prompt-data "$WORK/data/all.jsonl" --eval-interval "${EVAL_INTERVAL:-5}" --eval-temperature 0)
PERF_ARGS=(--actor-num-nodes 1 --actor-num-gpus-per-node 1 --max-tokens-per-gpu 512)
OPTIM_ARGS=(--lr 3e-4 --clip-grad 1.0)
LOG_ARGS=(--output-dir "$RUN")

rm -rf "$RUN"
"$PY" -m slime_like.train --num-rollout "${NUM_ROLLOUT:-100}" --advantage-estimator grpo \
  "${CKPT_ARGS[@]}" "${DATA_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${DAPO_ARGS[@]}" "${EVAL_ARGS[@]}" \
  "${PERF_ARGS[@]}" "${OPTIM_ARGS[@]}" "${LOG_ARGS[@]}" "$@"
"$PY" - "$RUN/metrics.jsonl" <<'PYEOF'
import json, sys
evals = [(r["step"], r["eval/reward_mean"]) for r in map(json.loads, open(sys.argv[1])) if "eval/reward_mean" in r]
print("eval reward (greedy accuracy):", " ".join(f"{s}:{v:.2f}" for s, v in evals))
PYEOF
