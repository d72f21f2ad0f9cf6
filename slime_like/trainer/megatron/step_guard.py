"""A step whose loss or gradients are not finite is skipped on every rank alike: the checks and the discard."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch


def all_finite(model: list[torch.nn.Module], local_loss: float, device: torch.device) -> bool:
    """Whether the loss and every gradient are finite on every rank (one all-reduce: all ranks decide alike)."""
    bad = torch.zeros(1, device=device)
    if not math.isfinite(local_loss):
        bad += 1
    for grad in model_grads(model):
        # A sum is NaN/inf when any entry is (fp32 overflow of a sum needs gradients near 1e30: skip those too).
        bad += (~torch.isfinite(torch.sum(grad, dtype=torch.float32))).float()
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
    return bad.item() == 0


def model_grads(model: list[torch.nn.Module]) -> Iterator[torch.Tensor]:
    """This rank's gradients: the DDP grad buffers (main_grad), else each parameter's grad."""
    for m in model:
        buffers = getattr(m, "buffers", None)  # megatron DDP's list of grad buffers (shadows Module.buffers)
        if isinstance(buffers, list):
            yield from (b.grad_data for b in buffers + list(getattr(m, "expert_parallel_buffers", [])))
            continue
        for p in m.parameters():
            grad = getattr(p, "main_grad", None)
            grad = p.grad if grad is None else grad
            if grad is not None:
                yield grad


def discard_grads(model: list[torch.nn.Module], optimizer: Any) -> None:
    """Zero the gradients of a skipped step (the next step zeroes them too: this keeps NaN out of offload)."""
    for m in model:
        m.zero_grad_buffer()
    optimizer.zero_grad()
