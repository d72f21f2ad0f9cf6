"""torchrun worker: train the fixed batch under several parallel layouts; rank 0 saves the results.

Usage: torchrun --nproc_per_node 2 tests/megatron/dist_worker.py OUT.pt LAYOUT:HF_DIR ...
with LAYOUT one of tp2, pp2, dp2, vpp2 (PP=2 with two virtual stages per rank), ep2 (two expert-parallel
ranks, which are also two data-parallel ranks for the dense layers); the ranks
re-initialise Megatron's parallel state for each run.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

SIZES = {
    "tp2": (2, 1, None),
    "pp2": (1, 2, None),
    "dp2": (1, 1, None),
    "vpp2": (1, 2, 2),
    "ep2": (1, 1, None),
}  # tp, pp, vpp
EXPERT_PARALLEL = {"ep2": 2}


def main(out: str, runs: list[str]) -> None:
    """Run each LAYOUT:HF_DIR in turn and save {run: results} from rank 0."""
    from megatron.core import parallel_state as mpu

    from slime_like.trainer.megatron.parallel import init_parallel
    from tests.megatron.common import train_run

    results = {}
    for run in runs:
        layout, hf_dir = run.split(":", 1)
        tp, pp, vpp = SIZES[layout]
        init_parallel(tp=tp, pp=pp, ep=EXPERT_PARALLEL.get(layout, 1), vpp=vpp, seed=1234)
        results[run] = train_run(hf_dir)
        mpu.destroy_model_parallel()
        dist.barrier()
    if dist.get_rank() == 0:
        torch.save(results, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
