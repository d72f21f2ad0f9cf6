"""torchrun worker: the tiny Qwen2.5-VL's log-probs and one train step under TP=2, DP=2 and PP=2; rank 0 saves them.

Usage: torchrun --nproc_per_node 2 tests/megatron/vlm_worker.py OUT.pt HF_DIR [LAYOUT,...]  (default: all three)
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

SIZES = {"tp2": (2, 1), "dp2": (1, 1), "pp2": (1, 2)}  # tp, pp


def main(out: str, hf_dir: str, layouts: str = ",".join(SIZES)) -> None:
    """Run each layout in turn (re-initialising Megatron's parallel state) and save {layout: results} from rank 0."""
    from megatron.core import parallel_state as mpu

    from slime_like.trainer.megatron.parallel import init_parallel
    from tests.megatron.test_vlm_parity import vlm_train_run

    results = {}
    for layout in layouts.split(","):
        tp, pp = SIZES[layout]
        init_parallel(tp=tp, pp=pp, seed=1234)
        results[layout] = vlm_train_run(hf_dir)
        mpu.destroy_model_parallel()
        dist.barrier()
    if dist.get_rank() == 0:
        torch.save(results, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
