"""Advantage whitening, loss aggregation, KL/IS terms and the PPO critic give the same steps with DP=1 and DP=2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.megatron.algo_common import DP_CONFIGS, run_config

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("algo_dp_worker.py")


def _torchrun(out: Path, hf_dir: Path, timeout: int = 300) -> None:
    """Run the worker on two ranks; on timeout kill torchrun's whole process group."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    proc = subprocess.Popen(
        [*cmd, str(WORKER), str(out), str(hf_dir)],
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


@pytest.mark.integration
def test_dp2_matches_dp1(tiny_qwen3: Path, megatron_world: None, tmp_path: Path, monkeypatch) -> None:
    from slime_like.actor import TrainActor

    _torchrun(tmp_path / "out.pt", tiny_qwen3)
    got = torch.load(tmp_path / "out.pt", weights_only=False)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, os.environ.get(key, "0"))  # TrainActor sets them; restored after the test
    for name in DP_CONFIGS:
        ref = run_config(TrainActor, tiny_qwen3, name)
        for step, (g, r) in enumerate(zip(got[name]["metrics"], ref["metrics"], strict=True)):
            assert sorted(g) == sorted(r), (name, step)
            for key, value in r.items():
                if not key.startswith("time/"):
                    assert g[key] == pytest.approx(value, abs=1e-5, rel=1e-4), (name, step, key)
        for hf_name, tensor in ref["weights"].items():
            torch.testing.assert_close(
                got[name]["weights"][hf_name], tensor, atol=1e-4, rtol=0, msg=f"{name} {hf_name}"
            )
