#!/usr/bin/env bash
# Install what is missing, lint, and run the whole test suite (what CI runs).
#   bash scripts/test.sh                 # everything
#   bash scripts/test.sh -m unit         # one tier: unit, megatron, integration or gpu (extra args go to pytest)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
bash scripts/setup-verifiers.sh  # the verifiers environment's tests (tests/integration/test_verifiers_env.py)
# The coding-agent CLIs and the sandbox's bubblewrap (tests/integration/test_coding_agents.py, test_local_sandbox.py);
# without npm or root their tests skip, naming this script.
bash scripts/setup-coding-agents.sh || echo "[test] scripts/setup-coding-agents.sh failed: the coding-agent tests skip" >&2
.venv/bin/ruff check .
.venv/bin/ruff format --check .
OMP_NUM_THREADS=1 exec .venv/bin/pytest "$@"
