"""torchrun worker: a MiniMax-M2 checkpoint's logits and every weight's gradient (as full HF tensors) at TP2.

Usage: torchrun --nproc_per_node 2 tests/megatron/all_heads_norm_worker.py HF_DIR OUT.pt [ONE_KV_HEAD_DIR]
The test computes the same in one process and compares: the all-heads QK norm spans the heads of both ranks.
ONE_KV_HEAD_DIR holds a config with a single key head, which TP2 must refuse (the error is saved too).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch


def logits_and_grads(hf_dir: str | Path) -> dict:
    """After init_parallel: logits of a fixed batch (eval mode: Megatron trains MoE at TP>1 only with sequence
    parallel, which the CPU lacks) and the gradient of their cross-entropy for every HF tensor."""
    from megatron.core import parallel_state as mpu
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    from slime_like.trainer.megatron.model import build_model, export_hf_weights, load_hf_weights, make_bridge

    bridge = make_bridge(hf_dir, torch.float32)
    model = build_model(bridge, wrap_with_ddp=False)
    load_hf_weights(bridge, model, hf_dir)
    chunk = model[0].eval()
    tokens = torch.randint(0, 512, (2, 19), generator=torch.Generator().manual_seed(1))
    mask = ~torch.ones(19, 19, dtype=torch.bool).tril()[None, None].expand(2, 1, 19, 19)
    logits = chunk(tokens, torch.arange(19)[None].expand(2, 19), mask)
    if mpu.get_tensor_model_parallel_world_size() > 1:
        logits = gather_from_tensor_model_parallel_region(logits)  # vocab-parallel output
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    loss.backward()
    with torch.no_grad():
        # Each parameter's gradient in its place, so the export gathers and names the gradients.
        for param in chunk.parameters():
            param.data = param.grad if param.grad is not None else torch.zeros_like(param)
        grads = {name: t.clone() for name, t in export_hf_weights(bridge, model)}
    return {"logits": logits.detach(), "grads": grads}


def main(hf_dir: str, out: str, one_kv_head: str | None = None) -> None:
    """Run at TP2 and save the result from rank 0."""
    import torch.distributed as dist

    from slime_like.trainer.megatron.model import make_bridge
    from slime_like.trainer.megatron.parallel import init_parallel

    init_parallel(tp=2, pp=1, seed=1234)
    result = logits_and_grads(hf_dir)
    if one_kv_head:
        try:
            make_bridge(one_kv_head, torch.float32)
        except ValueError as exc:
            result["one_kv_head_error"] = str(exc)
    if dist.get_rank() == 0:
        torch.save(result, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
