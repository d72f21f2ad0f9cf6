"""rollout/sglang_launch.py's caches of what SGLang recomputes at every LoRA update but cannot change while a server
runs: the CPU topology (`lscpu`) and the base model's MoE layers."""

from __future__ import annotations

import torch

from rollout import sglang_launch


def test_lscpu_runs_once_and_the_moe_map_is_read_once_per_model() -> None:
    calls = []

    def lscpu():
        calls.append("lscpu")
        return [(0, 0, 0, 0), (1, 1, 0, 0)]

    sglang_launch._LSCPU.clear()
    first = sglang_launch.lscpu_once(lscpu)
    first.append("changed by a caller")
    assert sglang_launch.lscpu_once(lscpu) == [(0, 0, 0, 0), (1, 1, 0, 0)] and calls == ["lscpu"]

    def gated(model):
        calls.append(model)
        return {0: True}

    one, two = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    assert sglang_launch.moe_gated_map_once(gated, one) == {0: True}
    assert sglang_launch.moe_gated_map_once(gated, one) == {0: True}
    assert sglang_launch.moe_gated_map_once(gated, two) == {0: True}
    assert calls == ["lscpu", one, two]
    sglang_launch._LSCPU.clear()
    sglang_launch._MOE_GATED.clear()
