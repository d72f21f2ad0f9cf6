"""torchrun worker: one MTP train step (tests/megatron/test_mtp.py's batch) at each layout named: tp2 (TP 2), ep2
(EP 2 over DP 2, the engine splitting the batch), dp2 (DP 2, each rank given its share: local=True) and pp2 (PP 2,
uneven as slime's --decoder-last-pipeline-num-layers makes it: the first stage 2 layers, the last 1 and the MTP
block); rank 0 saves {layout: (metrics, exported HF tensors after the step, log-probs and exported HF tensors
before it, per rank whether it holds the MTP block and its word embedding after the step)}; pp2 also saves a
torch_dist checkpoint after the step beside OUT.pt (pp2-ckpt).

Usage: torchrun --nproc_per_node 2 tests/megatron/mtp_worker.py OUT.pt HF_DIR [LAYOUT,...]  (default tp2,dp2)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

# layout: (init_parallel's sizes, the engine's TransformerConfig overrides)
LAYOUTS = {
    "tp2": ({"tp": 2}, {}),
    "ep2": ({"tp": 1, "ep": 2, "etp": 1}, {}),
    "dp2": ({"tp": 1}, {}),
    "pp2": ({"tp": 1, "pp": 2}, {"num_layers_in_last_pipeline_stage": 1}),
}


def _word_embedding(engine: object) -> torch.Tensor | None:
    """This rank's word embedding weight (the first stage's, or the copy the MTP stage holds), if it has one."""
    for chunk in engine.model:
        gpt = chunk
        while hasattr(gpt, "module"):
            gpt = gpt.module
        if hasattr(gpt, "embedding"):
            return gpt.embedding.word_embeddings.weight.detach().clone()
    return None


def main(out: str, hf_dir: str, layouts: str = "tp2,dp2") -> None:
    """Run the step at each layout and save the results from rank 0."""
    from megatron.core import parallel_state as mpu

    from tests.megatron.launch import run_layouts
    from tests.megatron.test_mtp import SEQUENCES, _batch, _engine, _policy_loss

    def step(layout: str) -> tuple:
        overrides = LAYOUTS[layout][1]
        engine = _engine(hf_dir, mtp=True, **overrides)
        holds_mtp: list = [None] * dist.get_world_size()
        dist.all_gather_object(holds_mtp, any(engine.mtp.on(chunk) for chunk in engine.model))
        initial = {n: t.clone() for n, t in engine.export_hf_weights()}
        logprobs = engine.forward_logprobs(SEQUENCES)
        batch = _batch()
        local = layout == "dp2"
        if local:  # this rank's share of the step: sequences 0 and 2 on rank 0, sequence 1 on rank 1
            batch = batch.select([i for i in range(len(batch)) if (i % 2) == mpu.get_data_parallel_rank()])
        masks = engine.mtp.loss_masks(batch)
        metrics = engine.train_step(batch.tokens, batch, _policy_loss, local=local, mtp_loss_masks=masks)
        exported = {n: t.clone() for n, t in engine.export_hf_weights()}
        if layout == "pp2":  # a torch_dist checkpoint of the PP 2 layout, the MTP stage's embedding copy included
            engine.save_checkpoint(Path(out).with_name("pp2-ckpt"))
        embeddings: list = [None] * dist.get_world_size()  # per rank its (TP part of the) word embedding
        dist.all_gather_object(embeddings, _word_embedding(engine))
        return metrics, exported, logprobs, initial, holds_mtp, embeddings

    run_layouts(out, [(layout, LAYOUTS[layout][0]) for layout in layouts.split(",")], step)


if __name__ == "__main__":
    main(*sys.argv[1:])
