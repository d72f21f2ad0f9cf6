"""torchrun worker: one MTP train step (tests/megatron/test_mtp.py's batch) at TP 2, then at DP 2 with each rank
given its share (local=True); rank 0 saves {layout: (metrics, exported HF tensors after the step)}.

Usage: torchrun --nproc_per_node 2 tests/megatron/mtp_worker.py OUT.pt HF_DIR
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist


def main(out: str, hf_dir: str) -> None:
    """Run the step at each layout and save the results from rank 0."""
    from megatron.core import parallel_state as mpu

    from slime_like.megatron.parallel import init_parallel
    from tests.megatron.test_mtp import SEQUENCES, _engine, _policy_loss, _rows

    results = {}
    for layout, tp in (("tp2", 2), ("dp2", 1)):
        init_parallel(tp=tp, seed=1234)
        engine = _engine(hf_dir, mtp=True)
        rows, sequences = _rows(), list(SEQUENCES)
        local = layout == "dp2"
        if local:  # this rank's share of the step: sequences 0 and 2 on rank 0, sequence 1 on rank 1
            mine = [i for i in range(len(sequences)) if (i % 2) == mpu.get_data_parallel_rank()]
            rows, sequences = [rows[i] for i in mine], [sequences[i] for i in mine]
        masks = engine.mtp.loss_masks(sequences, rows)
        metrics = engine.train_step(sequences, rows, _policy_loss, local=local, mtp_loss_masks=masks)
        results[layout] = (metrics, {n: t.clone() for n, t in engine.export_hf_weights()})
        mpu.destroy_model_parallel()
        dist.barrier()
    if dist.get_rank() == 0:
        torch.save(results, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
