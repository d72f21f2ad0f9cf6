"""Advantage whitening, loss aggregation, KL/IS terms and the PPO critic give the same steps with DP=1 and DP=2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.megatron.algo_common import DP_CONFIGS, run_config
from tests.megatron.launch import torchrun

WORKER = Path(__file__).with_name("algo_dp_worker.py")


def test_dp2_matches_dp1(tiny_qwen3: Path, megatron_world: None, tmp_path: Path, monkeypatch) -> None:
    from slime_like.trainer.actor import TrainActor

    torchrun(WORKER, [str(tmp_path / "out.pt"), str(tiny_qwen3)])
    got = torch.load(tmp_path / "out.pt", weights_only=False)
    start = load_file(tiny_qwen3 / "model.safetensors")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, os.environ.get(key, "0"))  # TrainActor sets them; restored after the test
    for name in DP_CONFIGS:
        ref = run_config(TrainActor, tiny_qwen3, name)
        for step, (g, r) in enumerate(zip(got[name]["metrics"], ref["metrics"], strict=True)):
            assert sorted(g) == sorted(r), (name, step)
            for key, value in r.items():
                if not key.startswith("time/"):
                    assert g[key] == pytest.approx(value, abs=1e-5, rel=1e-4), (name, step, key)
        # The updates agree to 1e-4 plus 2% of their own size: DP=2 sums gradients in another order, and Adam
        # divides each element's step by its own gradient scale, so on a rarely seen embedding row a 1e-7
        # gradient difference moves the step by up to ~1% (measured 1.5e-4 on a 1.5e-2 step on an AMD EPYC).
        for hf_name, tensor in ref["weights"].items():
            torch.testing.assert_close(
                got[name]["weights"][hf_name] - start[hf_name],
                tensor - start[hf_name],
                atol=1e-4,
                rtol=2e-2,
                msg=lambda m, where=f"{name} {hf_name}": f"{where}: {m}",
            )
