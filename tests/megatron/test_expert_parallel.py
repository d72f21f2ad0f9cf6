"""Qwen3-MoE with two expert-parallel gloo ranks (the all-to-all token dispatcher on CPU) trains exactly like one
process: same losses, grad norms, log-probs and exported weights."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.megatron.common import train_run
from tests.megatron.launch import torchrun
from tests.megatron.test_distributed import _assert_same

WORKER = Path(__file__).with_name("dist_worker.py")


def test_ep2_matches_single_process(tiny_qwen3_moe, megatron_world, tmp_path) -> None:
    run = f"ep2:{tiny_qwen3_moe}"
    torchrun(WORKER, [str(tmp_path / "out.pt"), run])
    result = torch.load(tmp_path / "out.pt", weights_only=False)[run]
    reference = train_run(tiny_qwen3_moe)
    assert reference["metrics"][0]["loss"] > reference["metrics"][2]["loss"]  # it learns
    _assert_same(result, reference, run)
