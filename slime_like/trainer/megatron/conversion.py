"""Tensor transforms between HF tensors and Megatron parameters: fusing, vocab padding, TP sharding.

Pure functions on full tensors (no communication); slime_like.trainer.megatron.hf_weights moves shards
between ranks. Every transform is a view, a slice or a concatenation, so a round trip is bit-exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Kinds whose Megatron tensor is [gate; up]: separate HF tensors, one already stacked (GLM-4's gate_up_proj), or one
# expert's slice of a layer's stacked experts (Qwen3-VL-MoE: stacked_experts.py).
_GATE_UP = ("gate_up", "fused_gate_up", "expert_gate_up")
# One expert's slice of a stacked HF experts tensor in the published layout ([hidden, 2 x inter] gate_up, [inter,
# hidden] down): Megatron's fc1 / fc2 is its transpose.
EXPERT_SLICES = ("expert_gate_up", "expert_down")
# Gated delta net (Qwen3-Next, Qwen3.5): Megatron's in_proj is [q; k; v; z; b; a] of all heads, conv1d [q; k; v].
_GDN_KINDS = ("gdn_in_proj", "gdn_in_proj_split", "gdn_conv1d")


@dataclass(frozen=True)
class AttentionShape:
    """What the fused-QKV layout depends on."""

    num_heads: int
    num_query_groups: int
    head_dim: int
    # Gated delta net layers (Qwen3-Next): key heads, value heads, key head dim, value head dim.
    linear: tuple[int, int, int, int] | None = None

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_query_groups

    def sections(self, kind: str) -> list[int] | None:
        """Rows of each part a TP rank takes its share of (GDN's fused in_proj and conv1d); None: plain chunks."""
        if self.linear is None or kind not in _GDN_KINDS:
            return None
        nk, nv, dk, dv = self.linear
        qkv = [nk * dk, nk * dk, nv * dv]
        return qkv if kind == "gdn_conv1d" else [*qkv, nv * dv, nv, nv]


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
    if kind in EXPERT_SLICES:
        return hf[0].t()
    if kind == "swap_halves":
        return _swap_halves(hf[0])
    if kind in ("gdn_conv1d", "gdn_in_proj_split"):  # conv1d: the same layout; Qwen3.5: qkv, z, b, a stacked
        return torch.cat(hf, dim=0)
    if kind == "gdn_in_proj":
        return _gdn_in_proj_to_megatron(hf, attn)
    if kind == "gated_qkv":
        return _gated_qkv_to_megatron(hf, attn)
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
    if kind in EXPERT_SLICES:
        return [full.t()]
    if kind == "swap_halves":
        return [_swap_halves(full)]
    if kind == "gdn_conv1d":
        return [full]
    if kind == "gdn_in_proj_split":
        return list(full.split(_split_sizes(attn), dim=0))
    if kind == "gdn_in_proj":
        return _gdn_in_proj_to_hf(full, attn)
    if kind == "gated_qkv":
        return _gated_qkv_to_hf(full, attn)
    if kind == "qkv":
        groups, per_group, hd = attn.num_query_groups, attn.heads_per_group, attn.head_dim
        tail = full.shape[1:]
        grouped = full.reshape(groups, (per_group + 2) * hd, *tail)
        q, k, v = grouped.split([per_group * hd, hd, hd], dim=1)
        return [t.reshape(-1, *tail) for t in (q, k, v)]
    raise ValueError(f"unknown conversion kind {kind!r}")


def _split_sizes(attn: AttentionShape) -> list[int]:
    """Rows of Qwen3.5's in_proj_qkv, in_proj_z, in_proj_b, in_proj_a in Megatron's in_proj."""
    q, k, v, z, b, a = attn.sections("gdn_in_proj")
    return [q + k + v, z, b, a]


def _gdn_in_proj_to_megatron(hf: list[torch.Tensor], attn: AttentionShape) -> torch.Tensor:
    """Qwen3-Next's in_proj_qkvz / in_proj_ba (grouped per key head: [q, k, v..., z...] and [b..., a...]) as
    Megatron's in_proj ([q; k; v; z; b; a], each over all heads)."""
    qkvz, ba = hf
    nk, nv, dk, dv = attn.linear
    per = nv // nk  # value heads per key head
    tail = qkvz.shape[1:]
    q, k, v, z = qkvz.reshape(nk, 2 * dk + 2 * per * dv, *tail).split([dk, dk, per * dv, per * dv], dim=1)
    b, a = ba.reshape(nk, 2 * per, *tail).split([per, per], dim=1)
    return torch.cat([t.reshape(-1, *tail) for t in (q, k, v, z, b, a)], dim=0)


def _gdn_in_proj_to_hf(full: torch.Tensor, attn: AttentionShape) -> list[torch.Tensor]:
    """The inverse of _gdn_in_proj_to_megatron: [in_proj_qkvz, in_proj_ba]."""
    nk = attn.linear[0]
    tail = full.shape[1:]
    q, k, v, z, b, a = (t.reshape(nk, -1, *tail) for t in full.split(attn.sections("gdn_in_proj"), dim=0))
    qkvz = torch.cat([q, k, v, z], dim=1).reshape(-1, *tail)
    return [qkvz, torch.cat([b, a], dim=1).reshape(-1, *tail)]


def _gated_qkv_to_megatron(hf: list[torch.Tensor], attn: AttentionShape) -> torch.Tensor:
    """Gated attention's q_proj (per head [query, gate]) with k, v as Megatron's linear_qkv: per query group its
    query heads, their gates, then its key and value."""
    q, k, v = hf
    groups, per_group, hd = attn.num_query_groups, attn.heads_per_group, attn.head_dim
    tail = q.shape[1:]
    q = q.reshape(groups, per_group, 2, hd, *tail).transpose(1, 2).reshape(groups, 2 * per_group * hd, *tail)
    fused = torch.cat([q, k.reshape(groups, hd, *tail), v.reshape(groups, hd, *tail)], dim=1)
    return fused.reshape(-1, *tail)


def _gated_qkv_to_hf(full: torch.Tensor, attn: AttentionShape) -> list[torch.Tensor]:
    """The inverse of _gated_qkv_to_megatron: [q_proj, k_proj, v_proj]."""
    groups, per_group, hd = attn.num_query_groups, attn.heads_per_group, attn.head_dim
    tail = full.shape[1:]
    q, k, v = full.reshape(groups, (2 * per_group + 2) * hd, *tail).split([2 * per_group * hd, hd, hd], dim=1)
    q = q.reshape(groups, 2, per_group, hd, *tail).transpose(1, 2).reshape(-1, *tail)
    return [q, k.reshape(-1, *tail), v.reshape(-1, *tail)]


def _swap_halves(weight: torch.Tensor) -> torch.Tensor:
    """The two halves of the input dimension swapped: MiMo's MTP input_proj reads [hidden, embedding], Megatron's
    eh_proj [embedding, hidden]."""
    first, second = weight.chunk(2, dim=1)
    return torch.cat([second, first], dim=1)


def shard(
    kind: str, full: torch.Tensor, dim: int, size: int, rank: int, attn: AttentionShape | None = None
) -> torch.Tensor:
    """This TP rank's part of a full Megatron tensor split along `dim` over `size` ranks.

    A gate_up fc1 shard holds its part of the gate followed by its part of the up projection.
    Fused QKV needs nothing special: each rank holds whole query groups, contiguous in the fused layout.
    """
    if size == 1:
        return full
    if sections := attn and attn.sections(kind):  # each rank: its share of every part, in order
        return torch.cat([part.chunk(size, dim=dim)[rank] for part in full.split(sections, dim=0)], dim=0)
    if kind in _GATE_UP:
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(size, dim=dim)[rank], up.chunk(size, dim=dim)[rank]], dim=0)
    return full.chunk(size, dim=dim)[rank]


def unshard(kind: str, shards: list[torch.Tensor], dim: int, attn: AttentionShape | None = None) -> torch.Tensor:
    """The full Megatron tensor from every TP rank's shard (the inverse of `shard`)."""
    if len(shards) == 1:
        return shards[0]
    if sections := attn and attn.sections(kind):
        parts = [s.split([n // len(shards) for n in sections], dim=0) for s in shards]
        return torch.cat([torch.cat([p[i] for p in parts], dim=dim) for i in range(len(sections))], dim=0)
    if kind in _GATE_UP:
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([torch.cat([h[0] for h in halves], dim=dim), torch.cat([h[1] for h in halves], dim=dim)])
    return torch.cat(shards, dim=dim)
