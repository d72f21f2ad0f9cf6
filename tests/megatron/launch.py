"""Run a worker script on several ranks with torchrun, killing the whole process group on timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def torchrun(worker: Path, args: list[str], timeout: int = 300, nproc: int = 2) -> str:
    """Run `worker args` on `nproc` ranks; fail the test with the output's tail if it fails or times out."""
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() < nproc:
        # Each rank takes its own GPU, and NCCL refuses two ranks on one device.
        pytest.skip(f"{nproc} ranks need {nproc} GPUs; this machine has {torch.cuda.device_count()}")
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
    proc = subprocess.Popen(
        [*cmd, str(worker), *args],
        env=env,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"torchrun timed out after {timeout} s:\n{output[-6000:]}")
    assert proc.returncode == 0, output[-8000:]
    return output
