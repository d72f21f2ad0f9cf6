"""torchrun worker: train the fixed batch under several parallel layouts; rank 0 saves the results.

Usage: torchrun --nproc_per_node 2 tests/megatron/dist_worker.py OUT.pt LAYOUT:HF_DIR ...
with LAYOUT one of tp2, pp2, dp2, vpp2 (PP=2 with two virtual stages per rank), ep2 (two expert-parallel
ranks, which are also two data-parallel ranks for the dense layers); the ranks
re-initialise Megatron's parallel state for each run.
"""

from __future__ import annotations

import sys

SIZES = {
    "tp2": {"tp": 2},
    "pp2": {"pp": 2},
    "dp2": {},
    "vpp2": {"pp": 2, "vpp": 2},
    "ep2": {"ep": 2},
}  # init_parallel's sizes


def main(out: str, runs: list[str]) -> None:
    """Run each LAYOUT:HF_DIR in turn and save {run: results} from rank 0."""
    from tests.megatron.common import train_run
    from tests.megatron.launch import run_layouts

    run_layouts(out, [(run, SIZES[run.split(":", 1)[0]]) for run in runs], lambda run: train_run(run.split(":", 1)[1]))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
