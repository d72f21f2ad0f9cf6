"""Reloadable process groups on two gloo ranks: destroyed and rebuilt, the same group objects keep working."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.megatron.launch import torchrun

WORKER = Path(__file__).with_name("reload_worker.py")


def test_groups_work_again_after_destroy_and_reload(tmp_path):
    torchrun(WORKER, ["groups", str(tmp_path / "out.pt")], timeout=180)
    per_rank = torch.load(tmp_path / "out.pt", weights_only=False)
    for rank, got in enumerate(per_rank):
        assert got["destroyed"] == 2 and got["reloaded"] == 2
        assert "not initialized" in got["while_destroyed"] or "destroyed" in got["while_destroyed"]
        assert got["after"] == got["before"], rank
        both, own = got["after"]
        assert (both["rank"], both["size"], both["ranks"], both["backend"]) == (rank, 2, [0, 1], "gloo")
        assert (own["rank"], own["size"], own["ranks"]) == (0, 1, [rank])
        assert both["all_reduce"] == [3.0] * 4  # 1 + 2
        assert both["all_gather"] == [[0.0, 0.0], [1.0, 1.0]]
        assert both["broadcast"] == [11.0] * 3  # from rank 1
        assert both["reduce_scatter"] == ([0.0, 3.0], [6.0, 9.0])[rank]  # arange(4) * (1 + 2), split
        assert both["all_gather_into_tensor"] == [0.0, 0.0, 1.0, 1.0]
        assert both["recv"] == [float(1 - rank)]
        assert own["all_reduce"] == [float(rank + 1)] * 4


def test_megatron_trains_the_same_through_a_group_rebuild(tiny_qwen3, tmp_path):
    torchrun(WORKER, ["megatron", str(tmp_path / "out.pt"), str(tiny_qwen3)])
    results = torch.load(tmp_path / "out.pt", weights_only=False)
    assert results["destroyed"] > 0 and results["reloaded"] == results["destroyed"]
    assert len(results["reloadable"]) == len(results["plain"]) == 4
    for step, (got, ref) in enumerate(zip(results["reloadable"], results["plain"], strict=True)):
        for key in ("loss", "grad_norm", "tokens", "lr"):
            assert got[key] == pytest.approx(ref[key], abs=1e-6), (step, key)
    assert results["plain"][-1]["loss"] < results["plain"][0]["loss"]  # it trains
