"""Fixtures of the unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def base(tiny_qwen3: Path) -> list[str]:
    """The required flags, with a real (tiny) HF checkpoint: parse_args checks model flags against it."""
    return ["--hf-checkpoint", str(tiny_qwen3), "--prompt-data", "x.jsonl", "--rollout-batch-size", "4",
            "--n-samples-per-prompt", "2", "--num-rollout", "3"]  # fmt: skip
