"""torchrun worker: the DP configs of algo_common on two data-parallel ranks; rank 0 saves the results.

Usage: torchrun --nproc_per_node 2 tests/megatron/algo_dp_worker.py OUT.pt HF_DIR
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist


def main(out: str, hf_dir: str) -> None:
    """Run every DP config and save {name: results} from rank 0."""
    from slime_like.trainer.actor import TrainActor
    from tests.megatron.algo_common import DP_CONFIGS, run_config

    rank = int(os.environ["RANK"])
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    results = {name: run_config(TrainActor, hf_dir, name, rank, dp=2, addr=addr, port=port) for name in DP_CONFIGS}
    if rank == 0:
        torch.save(results, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
