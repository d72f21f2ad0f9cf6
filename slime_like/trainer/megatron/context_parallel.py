"""Context parallelism (zig-zag) for "thd" micro-batches: split each sequence over CP ranks, gather outputs back.

Split: each padded sequence (its length a multiple of 2*cp) is cut into 2*cp equal chunks and CP rank r
keeps chunks r and 2*cp-1-r, so every rank holds one early (cheap under causal attention) and one late
(expensive) chunk. This is Transformer Engine's THD convention (`thd_get_partitioned_indices`, which
Megatron's `get_thd_batch_on_this_cp_rank` uses): rank r's row is, sequence after sequence, chunk r then
chunk 2*cp-1-r. The PackedSeqParams keep the FULL padded cu_seqlens: TE's CP attention and Megatron's
THD RoPE (`_apply_rotary_pos_emb_thd`) divide them by cp themselves.

Gather: each rank computes per-position log-probs (entropies, values) of its own positions, the target
of position j being the full sequence's token j+1, taken from the full row before the split (rolling a
local chunk would pair a chunk's last position with the wrong token). The ranks' results are
all-gathered over the CP group and put back in sequence order, so every rank holds the full
per-sequence outputs and the loss functions run on them unchanged.

Why the gradient is counted once, not cp times: every CP rank gathers the same full tensor and computes
the same loss L from it. The gather's backward gives each rank only its own slice of dL/d(full), with
no sum over ranks, so rank r back-propagates exactly dL/d(its tokens) and the ranks' parameter gradients
add up to the gradient of ONE copy of L. (The usual adjoint of an all-gather, a reduce-scatter, would
sum the cp identical copies and count L cp times.) That sum over CP ranks is DDP's all-reduce over
DP x CP; the engine's loss_rescale undoes DDP's averaging and the schedule's scaling (see engine.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from slime_like.trainer.megatron.packing import MicroBatch


def zigzag_positions(cu_seqlens: torch.Tensor, cp_size: int, cp_rank: int) -> torch.Tensor:
    """Positions (in the full row) that CP rank cp_rank holds, in its local order (chunks r, 2*cp-1-r)."""
    cu = cu_seqlens.to(torch.long).cpu()
    lengths = cu[1:] - cu[:-1]
    if bool((lengths % (2 * cp_size)).any()):
        raise ValueError(f"every sequence must be padded to a multiple of 2 * cp = {2 * cp_size}: {lengths.tolist()}")
    chunk = lengths // (2 * cp_size)
    first = cu[:-1] + cp_rank * chunk
    second = cu[:-1] + (2 * cp_size - 1 - cp_rank) * chunk
    starts = torch.stack([first, second], 1).flatten()
    sizes = chunk.repeat_interleave(2)
    block_start = torch.repeat_interleave(torch.cumsum(sizes, 0) - sizes, sizes)
    return torch.repeat_interleave(starts, sizes) + torch.arange(int(sizes.sum())) - block_start


@dataclass
class CPShard:
    """One CP rank's part of a "thd" micro-batch, and how to put the ranks' outputs back in order."""

    tokens: torch.Tensor  # [1, T/cp]
    position_ids: torch.Tensor  # [1, T/cp]
    targets: torch.Tensor  # [1, T/cp]: the full sequence's next token at each local position
    order: torch.Tensor  # [T]: full position p comes from the rank-concatenated outputs at order[p]
    positions: torch.Tensor  # [T/cp]: the full-row positions this rank holds, in its local order


def shard(mb: MicroBatch, cp_size: int, cp_rank: int) -> CPShard:
    """This rank's tokens, position ids and targets of a "thd" micro-batch under zig-zag CP."""
    if mb.cu_seqlens is None:
        raise ValueError("context parallelism needs the 'thd' layout (cu_seqlens); got a micro-batch without")
    per_rank = [zigzag_positions(mb.cu_seqlens, cp_size, r) for r in range(cp_size)]
    mine = per_rank[cp_rank]
    targets = mb.targets  # from the full row: position j's target is token j+1 of the same sequence
    order = torch.argsort(torch.cat(per_rank))
    return CPShard(mb.tokens[:, mine], mb.position_ids[:, mine], targets[:, mine], order, mine)


class _GatherOwnSliceGrad(torch.autograd.Function):
    """All-gather along the last dim; backward keeps this rank's slice only (see the module docstring)."""

    @staticmethod
    def forward(ctx, local: torch.Tensor, group) -> torch.Tensor:
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        parts = [torch.empty_like(local) for _ in range(size)]
        dist.all_gather(parts, local.contiguous(), group=group)
        ctx.span = (rank * local.shape[-1], (rank + 1) * local.shape[-1])
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        start, end = ctx.span
        return grad[..., start:end], None


def gather(local: torch.Tensor, cp_shard: CPShard, group) -> torch.Tensor:
    """Full-row [..., T] values from every CP rank's local [..., T/cp] values (autograd-aware)."""
    gathered = _GatherOwnSliceGrad.apply(local, group)
    return gathered.index_select(-1, cp_shard.order.to(gathered.device))
