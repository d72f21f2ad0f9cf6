"""Faults injected into a real run (Ray, two SGLang engines, the router, Megatron) with --use-fault-tolerance: an
engine killed, then one hung (SIGSTOP); the run finishes with every sample accounted for and every engine at the
trainer's weights."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from slime_like.core.secret import API_KEY_ENV
from tests.conftest import REPO_ROOT

BATCH, N = 4, 4  # prompts per rollout, samples per prompt

# About 2.5 minutes: run with `bash scripts/test.sh -m slow` (CI's 25 minutes have no room for it yet).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("task")
    rows = [{"prompt": f"{a}+{a}=", "label": str(2 * a)} for a in range(8)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def wait_for(what: str, done: object, proc: subprocess.Popen[str], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not done():  # type: ignore[operator]
        if proc.poll() is not None:
            raise AssertionError(f"the run ended while waiting for {what}:\n{proc.stdout.read()[-6000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def steps_done(out: Path) -> int:
    path = out / "metrics.jsonl"
    return sum(1 for line in path.read_text().splitlines() if "train/loss" in line) if path.exists() else 0


def test_a_killed_and_a_hung_engine_are_restarted_and_nothing_is_lost(
    tiny_qwen3: Path, task: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "slime_like.train", "--hf-checkpoint", str(tiny_qwen3),
        "--prompt-data", str(task / "train.jsonl"), "--input-key", "prompt", "--label-key", "label",
        "--rollout-batch-size", str(BATCH), "--n-samples-per-prompt", str(N), "--num-rollout", "8",
        "--rollout-max-response-len", "24", "--rollout-num-gpus", "2", "--lr", "1e-3",
        "--use-fault-tolerance", "--rollout-health-check-interval", "1", "--rollout-health-check-timeout", "5",
        "--check-weight-update", "--save-debug-rollout-data", "--output-dir", str(out), "--ray-num-cpus", "4",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", API_KEY_ENV: secrets.token_urlsafe(8)}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for("the first step", lambda: steps_done(out) >= 1, proc)
        killed = json.loads((out / "placement.json").read_text())["engines"][1]["pids"][0]
        os.kill(killed, signal.SIGKILL)
        wait_for("the third step", lambda: steps_done(out) >= 3, proc)
        # The restarted engine 1 is serving again; now hang engine 0 (it stops answering, its process stays).
        hung = json.loads((out / "placement.json").read_text())["engines"][0]["pids"][0]
        os.kill(hung, signal.SIGSTOP)
        output, _ = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, output[-6000:]
    assert output.count("failed its health check") == 2, output[-6000:]
    assert not psutil.pid_exists(hung) or psutil.Process(hung).status() == psutil.STATUS_ZOMBIE
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(r.get("rollout/engines_restarted", 0) for r in records) == 2
    # Every rollout trained all its groups: none failed, none lost (the accounting balanced at every rollout).
    train = [r for r in records if "train/loss" in r]
    assert len(train) == 8
    assert all(r["rollout/groups_trained"] == BATCH and r["rollout/groups_failed"] == 0 for r in train)
    dumps = sorted((out / "rollouts").glob("rollout_*.jsonl"))
    samples = [[json.loads(line) for line in f.read_text().splitlines()] for f in dumps]
    assert [len(s) for s in samples] == [BATCH * N] * 8
    assert all(s["status"] in ("completed", "truncated") for r in samples for s in r)
    # Every engine, restarted ones included, matched the trainer after every update.
    assert output.count("servers match the trainer") >= 9, output[-6000:]  # before the first rollout, then 8
