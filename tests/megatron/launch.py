"""Both sides of a multi-rank test: run a worker script with torchrun (killing its process group on timeout), and in
the worker run one body per parallel layout (run_layouts)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

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


def run_layouts(out: str | Path, layouts: Iterable[tuple[str, dict]], body: Callable[[str], Any]) -> None:
    """In a torchrun worker: per (key, init_parallel sizes), set up Megatron's parallel state, run body(key), tear the
    state down; then rank 0 saves {key: result} to `out` and the process group ends."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu

    from slime_like.trainer.megatron.parallel import init_parallel

    results = {}
    for key, sizes in layouts:
        init_parallel(**sizes, seed=1234)  # one seed for every layout: the same random state as the reference run
        results[key] = body(key)
        mpu.destroy_model_parallel()
        dist.barrier()
    if dist.get_rank() == 0:
        torch.save(results, out)
    dist.destroy_process_group()
