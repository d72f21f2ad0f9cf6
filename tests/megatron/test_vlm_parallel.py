"""The VL trainer under TP 2, DP 2 and EP 2 with images (vlm_worker.py, one torchrun for every family): per family,
each layout's packed log-probs of test_vlm_parity.py's two image samples equal transformers' within 1e-5, and after
one SGD step its exported HF weights (the vision tower's included) equal the one-process run's within 2e-6.

Families: Qwen2.5-VL, Qwen3-VL (deepstack), Qwen3.5 (hybrid, tied) at TP 2 and DP 2; Qwen3.5-MoE at DP 2 and EP 2
(Megatron refuses MoE with TP but no sequence parallel, which the CPU's local layer spec cannot run); Qwen3-VL-MoE at
EP 2 (its checkpoint's stacked experts split over the ranks and stacked back). PP 2 passes too for
Qwen2.5-VL (run vlm_worker.py with pp2:DIR); CI leaves it out to keep within its time. At PP 2, a frozen tower stays
out of an in-place update's export, also after a checkpoint load (frozen_weights.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.megatron.launch import torchrun
from tests.megatron.test_vlm_parity import (
    hf_logprobs,
    make_qwen3_5_vl,
    make_random_qwen2_5_vl,
    make_random_qwen3_vl,
    make_random_qwen3_vl_moe,
    vlm_train_run,
)

LAYOUTS = {
    "qwen2_5_vl": ("tp2", "dp2"),
    "qwen3_vl": ("tp2", "dp2"),
    "qwen3_5": ("tp2", "dp2"),
    "qwen3_5_moe": ("dp2", "ep2"),  # MoE with TP needs sequence parallel: not on CPU (local spec)
    "qwen3_vl_moe": ("ep2",),  # its stacked experts loaded and exported across two expert-parallel ranks
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory, tiny_qwen3: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vlm-parallel")
    return {
        "qwen2_5_vl": make_random_qwen2_5_vl(root / "qwen2_5_vl"),
        "qwen3_vl": make_random_qwen3_vl(root / "qwen3_vl"),
        "qwen3_5": make_qwen3_5_vl(root / "qwen3_5", tiny_qwen3),
        "qwen3_5_moe": make_qwen3_5_vl(root / "qwen3_5_moe", tiny_qwen3, moe=True),
        "qwen3_vl_moe": make_random_qwen3_vl_moe(root / "qwen3_vl_moe"),
    }


def frozen_tower_run(hf_dir: str | Path, checkpoint: Path) -> dict:
    """After init_parallel: a frozen-tower engine's full and in-place export names after a step, and its in-place ones
    after saving and loading a Megatron checkpoint (the recheck is a collective: a stage without the tower joins it)."""
    from tests.megatron.test_vlm_parity import _engine, _sum_logprob_loss, _train_data

    engine = _engine(Path(hf_dir), freeze=True)
    data = _train_data()
    engine.train_step(data.tokens, data, _sum_logprob_loss)
    full, in_place = ({n for n, _ in engine.export_hf_weights(in_place=flag)} for flag in (False, True))
    engine.save_checkpoint(checkpoint, with_optimizer=False)
    engine.load_checkpoint(checkpoint, load_optimizer=False, load_rng=False)
    return {"full": full, "in_place": in_place, "reloaded": {n for n, _ in engine.export_hf_weights(in_place=True)}}


@pytest.fixture(scope="module")
def parallel_runs(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every family's layouts in one torchrun (a second one would cost its start-up again)."""
    out = tmp_path_factory.mktemp("vlm-parallel-out") / "runs.pt"
    runs = [f"{layout}:{checkpoints[family]}" for family, layouts in LAYOUTS.items() for layout in layouts]
    runs.append(f"pp2-frozen:{checkpoints['qwen2_5_vl']}")
    torchrun(Path(__file__).with_name("vlm_worker.py"), [str(out), *runs], timeout=480)
    return torch.load(out)


@pytest.mark.parametrize("family", list(LAYOUTS))
def test_parallel_layouts_match_one_process_and_transformers(family, checkpoints, parallel_runs, megatron_world):
    hf_dir = checkpoints[family]
    single = vlm_train_run(hf_dir)
    expected = hf_logprobs(hf_dir)
    for ours, theirs in zip(single["logprobs"], expected, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    tower = "visual." if family == "qwen2_5_vl" else "model.visual."
    moved = [n for n, t in single["weights"].items() if n.startswith(tower)]
    assert moved, "the step exports the vision tower"
    for layout in LAYOUTS[family]:
        run = parallel_runs[f"{layout}:{hf_dir}"]
        for ours, theirs in zip(run["logprobs"], expected, strict=True):
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0, msg=layout)
        assert sorted(run["weights"]) == sorted(single["weights"]), layout
        for name, tensor in single["weights"].items():
            torch.testing.assert_close(run["weights"][name], tensor, atol=2e-6, rtol=0, msg=f"{layout}: {name}")
        assert run["metrics"]["loss"] == pytest.approx(single["metrics"]["loss"], rel=1e-6), layout


def test_frozen_tower_left_out_at_pp2_also_after_a_checkpoint_load(checkpoints, parallel_runs):
    """PP 2 with --freeze-params-name-list visual (frozen_weights.py): the in-place export is the full one less the
    tower (which the first stage holds), also after a Megatron checkpoint load, whose recheck both stages join."""
    run = parallel_runs[f"pp2-frozen:{checkpoints['qwen2_5_vl']}"]
    tower = {n for n in run["full"] if n.startswith("visual.")}
    assert tower and run["in_place"] == run["full"] - tower
    assert run["reloaded"] == run["in_place"]
