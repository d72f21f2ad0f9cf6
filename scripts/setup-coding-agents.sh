#!/usr/bin/env bash
# The coding-agent CLIs and the local sandbox they run in (plugins/local_sandbox.py, slime.agent.harness), idempotent
# (a fraction of a second when ready):
# - bubblewrap (apt), when missing and run as root;
# - Claude Code (@anthropic-ai/claude-code) and Codex (@openai/codex) from the npm registry into .agents-npm/ (both ship
#   native linux-x64 binaries in their npm packages: no Node.js runtime needed to run them, npm only to install).
#   bash scripts/setup-coding-agents.sh          # install what is missing
#   FORCE=1 bash scripts/setup-coding-agents.sh  # reinstall
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PREFIX="$ROOT/.agents-npm"
CLAUDE_CODE_VERSION="${CLAUDE_CODE_VERSION:-2.1.332}"
CODEX_VERSION="${CODEX_VERSION:-0.171.0}"
STAMP="$PREFIX/.slime_like_setup"
WANT="$(cat "$ROOT/scripts/setup-coding-agents.sh" | sha256sum | cut -d' ' -f1)-$CLAUDE_CODE_VERSION-$CODEX_VERSION"
if ! command -v bwrap >/dev/null; then
  if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
    echo "[setup] installing bubblewrap (apt)"
    (apt-get install -y -qq bubblewrap >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; })
  else
    echo "[setup] bubblewrap is missing: install it (apt-get install bubblewrap) for the local sandbox" >&2
  fi
fi
if [[ -z "${FORCE:-}" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  echo "[setup] .agents-npm is up to date"
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "[setup] npm is missing: install Node.js/npm (apt-get install npm) to fetch the coding-agent CLIs" >&2
  exit 1
fi
echo "[setup] installing Claude Code $CLAUDE_CODE_VERSION and Codex $CODEX_VERSION into $PREFIX (about 800 MB)"
mkdir -p "$PREFIX"
# --foreground-scripts: Claude Code's postinstall puts its native binary in place of the bin stub.
npm install --prefix "$PREFIX" --no-audit --no-fund --no-save --loglevel=error --foreground-scripts \
  "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "@openai/codex@$CODEX_VERSION" 2> >(grep -v EBADENGINE >&2)
"$PREFIX/node_modules/.bin/claude" --version
"$PREFIX/node_modules/.bin/codex" --version
chmod -R a+rX "$PREFIX"  # the sandboxes run as user ids of their own
echo "$WANT" > "$STAMP"
