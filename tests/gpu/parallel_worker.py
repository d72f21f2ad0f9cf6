"""torchrun worker (CUDA, NCCL): the tiny model under several layouts in turn; rank 0 saves the results.

Usage: torchrun --nproc_per_node N tests/gpu/parallel_worker.py OUT.pt HF_DIR RUN ...
RUN: thd / padded (micro-batch layouts, any N), dp2 (the 2-GPU reference), cp2 (context parallel),
tp2, tp2sp (TP=2 with sequence parallel). Each run re-initialises Megatron's parallel state.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

RUNS: dict[str, tuple[dict, dict]] = {  # init_parallel kwargs, engine kwargs
    "thd": ({}, {"layout": "thd"}),
    "padded": ({}, {"layout": "padded"}),
    "dp2": ({}, {}),
    "cp2": ({"cp": 2}, {}),
    "tp2": ({"tp": 2}, {}),
    "tp2sp": ({"tp": 2, "sequence_parallel": True}, {}),
}


def gpu_run(hf_dir: str, **engine_kwargs) -> dict:
    """Log-probs and entropies, three bf16 optimizer steps (the last with an entropy bonus), log-probs again."""
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.optimizer import OptimizerSettings
    from tests.megatron.common import fixed_batch, num_targets, token_ce_loss

    engine = MegatronTrainEngine(
        hf_dir, OptimizerSettings(lr=1e-3), max_tokens_per_micro_batch=64, dtype=torch.bfloat16, **engine_kwargs
    )
    seqs = fixed_batch()
    before, entropy = engine.forward_logprobs(seqs, with_entropy=True)
    ce = token_ce_loss(num_targets(seqs))
    metrics = [engine.train_step(seqs, [None] * len(seqs), ce) for _ in range(2)]
    bonus = token_ce_loss(num_targets(seqs), entropy_coef=0.1)
    metrics.append(engine.train_step(seqs, [None] * len(seqs), bonus, with_entropy=True))
    after = engine.forward_logprobs(seqs)
    return {
        "layout": engine.layout,
        "pad_multiple": engine.pad_multiple,
        "before": [x.float().cpu() for x in before],
        "entropy": [x.float().cpu() for x in entropy],
        "metrics": metrics,
        "after": [x.float().cpu() for x in after],
    }


def main(out: str, hf_dir: str, runs: list[str]) -> None:
    """Run each RUN in turn and save {run: results} from rank 0."""
    from megatron.core import parallel_state as mpu

    from slime_like.trainer.megatron.parallel import init_parallel

    results = {}
    for run in runs:
        init_kwargs, engine_kwargs = RUNS[run]
        init_parallel(seed=1234, **{"sequence_parallel": False, **init_kwargs})
        results[run] = gpu_run(hf_dir, **engine_kwargs)
        mpu.destroy_model_parallel()
        dist.barrier()
    if dist.get_rank() == 0:
        torch.save(results, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
