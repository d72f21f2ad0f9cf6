"""Entry points parse arguments before importing heavy libraries (checked in a fresh interpreter)."""

from __future__ import annotations

import sys


def test_help_does_not_import_torch() -> None:
    import subprocess

    code = "import sys; from slime_like.arguments import build_parser; build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
