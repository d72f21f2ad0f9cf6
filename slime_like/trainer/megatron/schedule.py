"""Micro-batches of Megatron's schedule: their layout, how each DP rank plans its share, and the loss rescale."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from buffer.train_data import TrainData
from slime_like.trainer.megatron.packing import (
    MicroBatch,
    pack,
    padded_length,
    split_for_dp,
    split_micro_batches,
)

LAYOUT_ENV = "SLIME_LIKE_MICRO_BATCH_LAYOUT"


def choose_layout(requested: str | None, transformer_engine: bool) -> str:
    """The micro-batch layout: requested (or $SLIME_LIKE_MICRO_BATCH_LAYOUT), else "thd" with TE, "packed" without."""
    requested = requested or os.environ.get(LAYOUT_ENV) or None
    # TE's causal attention ignores an explicit mask (no "packed"); Megatron's local attention refuses
    # PackedSeqParams (no "thd").
    allowed = ("thd", "padded") if transformer_engine else ("packed", "padded")
    if requested is None:
        return allowed[0]
    if requested not in allowed:
        backend = "Transformer Engine" if transformer_engine else "Megatron's local attention (no CUDA/TE)"
        raise ValueError(f"micro-batch layout {requested!r} ({LAYOUT_ENV}) does not work with {backend}: use {allowed}")
    return requested


def loss_rescale(num_microbatches: int) -> int:
    """What a loss share is multiplied by so that Megatron's scaling leaves the plain sum of shares.

    Megatron's schedule multiplies a (loss, metrics) result by the CP size and divides it by
    num_microbatches (forward_step_calc_loss); DDP averages gradients over DP x CP. So: x num_mb x DP.
    """
    from megatron.core import parallel_state as mpu

    dp_cp = mpu.get_data_parallel_world_size(with_context_parallel=True)
    return num_microbatches * dp_cp // mpu.get_context_parallel_world_size()


def merge_indexed(parts: list[dict[int, Any]]) -> dict[int, Any]:
    """Per-sequence outputs of several ranks, by batch index, in one dict."""
    return {i: v for part in parts for i, v in part.items()}


def max_over_dp(count: int, device: torch.device) -> int:
    """The largest `count` of the DP ranks (each plans its own share; the schedule needs one micro-batch count)."""
    from megatron.core import parallel_state as mpu

    if mpu.get_data_parallel_world_size() == 1:
        return count
    box = torch.tensor([count], dtype=torch.int64, device=device)
    torch.distributed.all_reduce(box, op=torch.distributed.ReduceOp.MAX, group=mpu.get_data_parallel_group())
    return int(box.item())


def sum_dicts(parts: list[dict[str, float]]) -> dict[str, float]:
    """Metric dicts of several ranks, summed key by key."""
    total: dict[str, float] = {}
    for part in parts:
        for key, value in part.items():
            total[key] = total.get(key, 0.0) + value
    return total


def micro_batch_data(data: TrainData | Sequence[Any], indices: list[int], device: torch.device) -> Any:
    """A loss function's data of one micro-batch: a training batch's rows at `indices`, their tensors on the logits'
    device (the trainer makes them on the CPU), or those items of a plain per-sequence list."""
    if isinstance(data, TrainData):
        return data.select(indices).to(device)
    return [data[i] for i in indices]


def plan_micro_batches(
    sequences: Sequence[Sequence[int] | torch.Tensor],
    layout: str,
    pad: int,
    max_tokens: int,
    chunks: int,
    device: torch.device,
    local: bool = False,
) -> list[MicroBatch]:
    """This DP rank's micro-batches (local: of all `sequences`, its share) of at most `max_tokens` tokens; every DP
    rank gets the same count (filler micro-batches), a multiple of PP with `chunks` > 1 model chunks (VPP)."""
    from megatron.core import parallel_state as mpu

    lengths = [len(s) for s in sequences]
    if layout == "thd":  # budgets count the padding each sequence gets
        lengths = [padded_length(n, pad) for n in lengths]
    if local:
        plans = [split_micro_batches(range(len(lengths)), lengths, max_tokens)]
        count = max_over_dp(max(1, len(plans[0])), device)
    else:
        shares = split_for_dp(lengths, mpu.get_data_parallel_world_size())
        plans = [split_micro_batches(share, lengths, max_tokens) for share in shares]
        count = max(1, *(len(p) for p in plans))
    if chunks > 1:  # the interleaved (VPP) schedule wants a multiple of PP micro-batches
        pp = mpu.get_pipeline_model_parallel_world_size()
        count = -(-count // pp) * pp
    mine = plans[0 if local else mpu.get_data_parallel_rank()]
    mine = mine + [[] for _ in range(count - len(mine))]
    return [pack(sequences, ids, layout, pad) for ids in mine]
