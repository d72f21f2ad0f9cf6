#!/usr/bin/env bash
# Create .venv-verifiers/ with prime-rl's verifiers (requirements/verifiers.txt), idempotent (seconds when ready).
# verifiers needs openai>=2.9 and SGLang pins openai==2.6.1, so verifiers environments run in their own process from
# this venv (plugins/verifiers_env.py) and call the rollout's OpenAI-compatible endpoint over HTTP.
#   bash scripts/setup-verifiers.sh          # install what is missing
#   FORCE=1 bash scripts/setup-verifiers.sh  # reinstall
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-verifiers"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
STAMP="$VENV/.slime_like_setup"
WANT="$(cat "$ROOT/scripts/setup-verifiers.sh" "$ROOT/requirements/verifiers.txt" | sha256sum | cut -d' ' -f1)"
if [[ -z "${FORCE:-}" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  echo "[setup] .venv-verifiers is up to date"
  exit 0
fi
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
echo "[setup] installing verifiers into $VENV (about a minute the first time)"
"$VENV/bin/python" -m pip --disable-pip-version-check -q install -r "$ROOT/requirements/verifiers.txt" 2> >(grep -v "is ignored: it is neither" >&2)
"$VENV/bin/python" -c "import verifiers, openai; print('[setup] verifiers', verifiers.__version__, 'openai', openai.__version__)"
echo "$WANT" > "$STAMP"
