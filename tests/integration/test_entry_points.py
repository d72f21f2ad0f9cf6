"""Entry points parse arguments before importing heavy libraries (checked in a fresh interpreter)."""

from __future__ import annotations

import sys


def test_help_does_not_import_torch() -> None:
    import subprocess

    code = "import sys; from slime_like.arguments import build_parser; build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_family_check_imports_no_bridge() -> None:
    """family_of (the start-up check in slime_like/arguments.py, every run and dry run) leaves mbridge and Megatron
    unimported: the family table names its bridges by path (seconds per start)."""
    import subprocess

    code = (
        "import sys; from types import SimpleNamespace as N\n"
        "from slime_like.trainer.megatron.families import family_of\n"
        "family_of(N(model_type='qwen3'))\n"
        "print(sorted(m for m in ('mbridge', 'megatron.core') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
