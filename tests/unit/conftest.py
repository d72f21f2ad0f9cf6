"""Fixtures of the unit tests, which run in the pytest process alone: starting any process fails here."""

from __future__ import annotations

import multiprocessing.util
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from slime_like.core.sample import Sample, use_sample_type


def _refuse(*args: object, **kwargs: object) -> None:
    raise AssertionError(
        "a unit test started a process: unit tests stay in the pytest process (move it to tests/integration)"
    )


@pytest.fixture(autouse=True)
def no_subprocesses(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Keep the unit tier fast and self-contained: no subprocess, fork or multiprocessing child."""
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse)
    monkeypatch.setattr(os, "fork", _refuse)
    monkeypatch.setattr(os, "posix_spawn", _refuse)
    monkeypatch.setattr(multiprocessing.util, "spawnv_passfds", _refuse)  # spawn and forkserver start methods
    yield


@pytest.fixture(autouse=True)
def our_samples() -> Iterator[None]:
    """Loading a slime plugin makes new samples slime's Sample for the process: each test starts with ours."""
    use_sample_type(Sample)
    yield


@pytest.fixture
def base(tiny_qwen3: Path) -> list[str]:
    """The required flags, with a real (tiny) HF checkpoint: parse_args checks model flags against it."""
    return ["--hf-checkpoint", str(tiny_qwen3), "--prompt-data", "x.jsonl", "--rollout-batch-size", "4",
            "--n-samples-per-prompt", "2", "--num-rollout", "3"]  # fmt: skip
