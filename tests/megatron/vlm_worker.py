"""torchrun worker: a tiny VLM's log-probs of test_vlm_parity.py's image samples and one train step on them, per
LAYOUT:HF_DIR run (LAYOUT one of tp2, dp2, pp2, ep2: two expert-parallel ranks, also two data-parallel ranks for the
dense layers; LAYOUT-frozen: the frozen tower's in-place export, test_vlm_parallel.py); rank 0 saves {run: results}.

Usage: torchrun --nproc_per_node 2 tests/megatron/vlm_worker.py OUT.pt LAYOUT:HF_DIR ...
"""

from __future__ import annotations

import sys
from pathlib import Path

SIZES = {"tp2": {"tp": 2}, "dp2": {}, "pp2": {"pp": 2}, "ep2": {"ep": 2}}  # init_parallel's sizes


def main(out: str, runs: list[str]) -> None:
    """Run each LAYOUT:HF_DIR in turn and save {run: results} from rank 0 (LAYOUT-frozen: frozen_tower_run's)."""
    from tests.megatron.launch import run_layouts
    from tests.megatron.test_vlm_parallel import frozen_tower_run
    from tests.megatron.test_vlm_parity import vlm_train_run

    def body(run: str) -> dict:
        layout, hf_dir = run.split(":", 1)
        if layout.endswith("-frozen"):
            return frozen_tower_run(hf_dir, Path(out).with_name(f"{layout}-ckpt"))
        return vlm_train_run(hf_dir)

    run_layouts(out, [(run, SIZES[run.split(":", 1)[0].removesuffix("-frozen")]) for run in runs], body)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
