"""torchrun worker: one MTP train step (tests/megatron/test_mtp.py's batch) at each layout named: tp2 (TP 2), ep2
(EP 2 over DP 2, the engine splitting the batch) and dp2 (DP 2, each rank given its share: local=True); rank 0
saves {layout: (metrics, exported HF tensors after the step)}.

Usage: torchrun --nproc_per_node 2 tests/megatron/mtp_worker.py OUT.pt HF_DIR [LAYOUT,...]  (default tp2,dp2)
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

LAYOUTS = {"tp2": {"tp": 2}, "ep2": {"tp": 1, "ep": 2, "etp": 1}, "dp2": {"tp": 1}}


def main(out: str, hf_dir: str, layouts: str = "tp2,dp2") -> None:
    """Run the step at each layout and save the results from rank 0."""
    from megatron.core import parallel_state as mpu

    from slime_like.trainer.megatron.parallel import init_parallel
    from tests.megatron.test_mtp import _batch, _engine, _policy_loss

    results = {}
    for layout in layouts.split(","):
        init_parallel(**LAYOUTS[layout], seed=1234)
        engine = _engine(hf_dir, mtp=True)
        batch = _batch()
        local = layout == "dp2"
        if local:  # this rank's share of the step: sequences 0 and 2 on rank 0, sequence 1 on rank 1
            batch = batch.select([i for i in range(len(batch)) if (i % 2) == mpu.get_data_parallel_rank()])
        masks = engine.mtp.loss_masks(batch)
        metrics = engine.train_step(batch.tokens, batch, _policy_loss, local=local, mtp_loss_masks=masks)
        results[layout] = (metrics, {n: t.clone() for n, t in engine.export_hf_weights()})
        mpu.destroy_model_parallel()
        dist.barrier()
    if dist.get_rank() == 0:
        torch.save(results, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
