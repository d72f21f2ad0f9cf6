# Shared by scripts/run-*.sh (sourced): Python, Ray on the head node, dry run, and the job itself.
#   DRY_RUN=1           check every argument against the HF config and the cluster, print the plan, start nothing
#   RAY_ADDRESS=h:6379  join an existing Ray cluster (multi-node: start `ray start --address h:6379` on every other node)
#   MASTER_ADDR=ip      this (head) node's address when a script starts Ray itself
#   PYTHON=...          interpreter (default: the repo's .venv, else python3)
SCRIPTS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPO_ROOT="$(dirname "$SCRIPTS_DIR")"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then PYTHON="$REPO_ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi

run_job() {  # usage: run_job MODULE ARGS...   (MODULE: slime_like.train or slime_like.train_async)
  local module="$1"; shift
  cd "$REPO_ROOT"
  if [[ -n "${DRY_RUN:-}" ]]; then
    exec "$PYTHON" -m "$module" "$@" --dry-run
  fi
  if [[ -z "${RAY_ADDRESS:-}" ]]; then
    # Single node, or the head of a multi-node cluster: start Ray here and let the others join. On one node
    # (no MASTER_ADDR) Ray must keep 127.0.0.1, or the driver cannot reach it.
    [[ -z "${MASTER_ADDR:-}" ]] && export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
    "$PYTHON" -m ray.scripts.scripts start --head --node-ip-address "${MASTER_ADDR:-127.0.0.1}" \
      --num-gpus "${GPUS_PER_NODE:-8}" --disable-usage-stats
    export RAY_ADDRESS="${MASTER_ADDR:-127.0.0.1}:6379"
    trap '"$PYTHON" -m ray.scripts.scripts stop --force >/dev/null 2>&1' EXIT
  fi
  "$PYTHON" -m "$module" "$@"
}
