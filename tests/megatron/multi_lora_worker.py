"""torchrun worker of test_multi_lora_parallel.py: the multi-LoRA run, with its save and resume, in each layout
named (dp2, tp2) on two ranks; rank 0 saves {layout: results}.

Usage: torchrun --nproc_per_node 2 tests/megatron/multi_lora_worker.py OUT.pt HF_DIR CONFIG_DIR WORK_DIR LAYOUT...
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def main(out: str, hf_dir: str, configs: str, work: str, *layouts: str) -> None:
    from megatron.core import parallel_state as mpu

    from slime_like.trainer.actor import TrainActor
    from tests.megatron.test_multi_lora_parallel import LAYOUTS, run_layout

    rank = int(os.environ["RANK"])
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    results = {}
    for layout in layouts:
        checkpoint = Path(work) / f"checkpoint-{layout}"
        where = {"rank": rank, "addr": addr, "port": port, **LAYOUTS[layout]}
        results[layout] = run_layout(TrainActor, hf_dir, configs, checkpoint, **where)
        mpu.destroy_model_parallel()  # the next layout builds its own groups in this world
    if rank == 0:
        torch.save(results, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
