"""Tensor transforms between HF tensors and Megatron parameters: fusing, vocab padding, TP sharding.

Pure functions on full tensors (no communication); slime_like.megatron.hf_weights moves shards
between ranks. Every transform is a view, a slice or a concatenation, so a round trip is bit-exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Kinds whose Megatron tensor is [gate; up]: separate HF tensors, or one already stacked (GLM-4's gate_up_proj).
_GATE_UP = ("gate_up", "fused_gate_up")


@dataclass(frozen=True)
class AttentionShape:
    """What the fused-QKV layout depends on."""

    num_heads: int
    num_query_groups: int
    head_dim: int

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_query_groups


def to_megatron(
    kind: str, hf: list[torch.Tensor], attn: AttentionShape | None, rows: int | None = None
) -> torch.Tensor:
    """The full (unsharded) Megatron tensor made of these HF tensors.

    `rows` is Megatron's (padded) vocabulary size for "vocab" tensors; padding rows are zero.
    """
    if kind == "copy":
        return hf[0]
    if kind == "vocab":
        (weight,) = hf
        if rows is None or rows == weight.shape[0]:
            return weight
        if rows < weight.shape[0]:
            raise ValueError(f"Megatron's vocabulary ({rows} rows) is smaller than the HF one ({weight.shape[0]})")
        return torch.cat([weight, weight.new_zeros(rows - weight.shape[0], *weight.shape[1:])])
    if kind == "gate_up":
        return torch.cat(hf, dim=0)
    if kind == "fused_gate_up":
        return hf[0]
    if kind == "qkv":
        q, k, v = hf
        groups, per_group, hd = attn.num_query_groups, attn.heads_per_group, attn.head_dim
        tail = q.shape[1:]
        fused = torch.cat(
            [q.reshape(groups, per_group * hd, *tail), k.reshape(groups, hd, *tail), v.reshape(groups, hd, *tail)],
            dim=1,
        )
        return fused.reshape(-1, *tail)
    raise ValueError(f"unknown conversion kind {kind!r}")


def to_hf(kind: str, full: torch.Tensor, attn: AttentionShape | None, hf_rows: int | None = None) -> list[torch.Tensor]:
    """The HF tensors of one full Megatron tensor (views where possible); "vocab" drops padding rows."""
    if kind == "copy":
        return [full]
    if kind == "vocab":
        return [full if hf_rows is None else full[:hf_rows]]
    if kind == "gate_up":
        return list(full.chunk(2, dim=0))
    if kind == "fused_gate_up":
        return [full]
    if kind == "qkv":
        groups, per_group, hd = attn.num_query_groups, attn.heads_per_group, attn.head_dim
        tail = full.shape[1:]
        grouped = full.reshape(groups, (per_group + 2) * hd, *tail)
        q, k, v = grouped.split([per_group * hd, hd, hd], dim=1)
        return [t.reshape(-1, *tail) for t in (q, k, v)]
    raise ValueError(f"unknown conversion kind {kind!r}")


def shard(kind: str, full: torch.Tensor, dim: int, size: int, rank: int) -> torch.Tensor:
    """This TP rank's part of a full Megatron tensor split along `dim` over `size` ranks.

    A gate_up fc1 shard holds its part of the gate followed by its part of the up projection.
    Fused QKV needs nothing special: each rank holds whole query groups, contiguous in the fused layout.
    """
    if size == 1:
        return full
    if kind in _GATE_UP:
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(size, dim=dim)[rank], up.chunk(size, dim=dim)[rank]], dim=0)
    return full.chunk(size, dim=dim)[rank]


def unshard(kind: str, shards: list[torch.Tensor], dim: int) -> torch.Tensor:
    """The full Megatron tensor from every TP rank's shard (the inverse of `shard`)."""
    if len(shards) == 1:
        return shards[0]
    if kind in _GATE_UP:
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([torch.cat([h[0] for h in halves], dim=dim), torch.cat([h[1] for h in halves], dim=dim)])
    return torch.cat(shards, dim=dim)
