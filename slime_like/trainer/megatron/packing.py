"""Split a batch of variable-length sequences over DP ranks and micro-batches, and pack micro-batches.

Three layouts of a micro-batch's token rows:
- "packed" (Megatron's local attention, the CPU path): several whole sequences in one row with a
  block-diagonal causal mask and per-sequence position ids (RoPE is relative, so packed log-probs match
  separate forwards to ~5e-7).
- "thd" (Transformer Engine): the same single row [1, T] without a mask; attention is told where each
  sequence starts by `cu_seqlens` (Megatron's PackedSeqParams, qkv_format "thd"). Each sequence is
  right-padded to a multiple of `pad_multiple` (what sequence parallel / context parallel need); the
  padding sits after the sequence's last token, so causal attention keeps real tokens blind to it,
  and it gets no loss.
- "padded": one right-padded row per sequence and plain causal attention, a fallback for attention
  kernels that ignore an explicit mask (Transformer Engine's causal mode) without THD support.
Sequences are never split across micro-batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import torch

from buffer.train_data import balanced_split

LAYOUTS = ("packed", "thd", "padded")


@dataclass
class MicroBatch:
    """Token rows of one micro-batch, and where each sequence sits in them."""

    indices: list[int]  # index of each sequence in the caller's batch (-1: filler, no loss)
    rows: list[int]
    starts: list[int]
    lengths: list[int]  # real (unpadded) lengths
    tokens: torch.Tensor  # [rows, T] int64
    position_ids: torch.Tensor  # [rows, T] int64
    attention_mask: torch.Tensor | None  # [rows, 1, T, T] bool, True = masked out; None for "thd"
    cu_seqlens: torch.Tensor | None = None  # "thd": int32 [n + 1] boundaries of the padded sequences

    @property
    def num_tokens(self) -> int:
        """Real (unpadded) tokens in the micro-batch."""
        return sum(self.lengths)

    @property
    def targets(self) -> torch.Tensor:
        """The token each position predicts (tokens[:, j+1]); at sequence ends it is never used."""
        return torch.roll(self.tokens, -1, dims=1)

    def packed_seq_params(self, device: torch.device | str | None = None):
        """Megatron's PackedSeqParams of a "thd" micro-batch (None for the other layouts)."""
        if self.cu_seqlens is None:
            return None
        from megatron.core.packed_seq_params import PackedSeqParams

        cu_seqlens = self.cu_seqlens.to(device) if device is not None else self.cu_seqlens
        max_seqlen = int((self.cu_seqlens[1:] - self.cu_seqlens[:-1]).max())
        # cu_seqlens already count each sequence's padding, so no *_padded fields: TE falls back to
        # cu_seqlens for them, and Megatron's THD RoPE reads the same boundaries.
        return PackedSeqParams(
            qkv_format="thd",
            cu_seqlens_q=cu_seqlens,
            cu_seqlens_kv=cu_seqlens,
            max_seqlen_q=max_seqlen,
            max_seqlen_kv=max_seqlen,
        )

    def per_sequence(self, values: torch.Tensor) -> list[torch.Tensor]:
        """Cut a [rows, T, ...] per-position tensor into per-sequence predictions of tokens 1..L-1.

        Position j holds the prediction of token j+1, so sequence k gets values[start : start+L-1].
        Without a graph (log-prob forwards) the pieces come from one split of the flat values, not one slice each.
        """
        places = list(zip(self.indices, self.rows, self.starts, self.lengths, strict=True))
        if values.requires_grad:  # training keeps one slice per sequence: the same backward as always
            return [values[row, start : start + length - 1] for idx, row, start, length in places if idx >= 0]
        width, sizes, keep, end = values.shape[1], [], [], 0
        for idx, row, start, length in places:  # in row-major order of their places, as pack lays them out
            begin, size = row * width + start, max(length - 1, 0)
            if begin < end:  # not laid out by pack: a slice each
                return [values[r, b : b + n - 1] for i, r, b, n in places if i >= 0]
            if begin > end:
                sizes.append(begin - end)  # a gap: last positions, padding, filler
                keep.append(False)
            sizes.append(size)
            keep.append(idx >= 0)
            end = begin + size
        flat = values.reshape(-1, *values.shape[2:])  # [rows * T, ...]
        sizes.append(flat.shape[0] - end)
        keep.append(False)
        return [piece for piece, kept in zip(flat.split(sizes), keep, strict=True) if kept]


def pad_multiple(tp_size: int = 1, cp_size: int = 1, sequence_parallel: bool = False) -> int:
    """What each sequence's length is padded to a multiple of: 2*cp (zig-zag halves) times tp (with SP).

    Context parallel cuts every sequence into 2*cp equal chunks; sequence parallel cuts each rank's
    token row into tp equal parts, which a multiple of 2*cp*tp per sequence guarantees after the CP split.
    """
    return (2 * cp_size if cp_size > 1 else 1) * (tp_size if sequence_parallel else 1)


def padded_length(length: int, multiple: int) -> int:
    """length rounded up to a multiple of `multiple`."""
    return -(-length // multiple) * multiple


def split_for_dp(lengths: Sequence[int], dp_size: int) -> list[list[int]]:
    """Deterministic token-balanced partition of sequence indices over DP ranks (each in input order).

    The rollout side's split (buffer.train_data.balanced_split), so a full batch given to the engine is split as
    the rollout manager splits it. With fewer sequences than ranks some shares are empty (the engine runs a
    filler micro-batch there).
    """
    return balanced_split(list(lengths), dp_size)


def split_micro_batches(indices: Sequence[int], lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Group indices into micro-batches of at most max_tokens tokens (first-fit decreasing).

    A sequence longer than max_tokens gets a micro-batch of its own (sequences are never split).
    """
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in sorted(indices, key=lambda i: (-lengths[i], i)):
        for b, load in enumerate(loads):
            if load + lengths[i] <= max_tokens:
                bins[b].append(i)
                loads[b] += lengths[i]
                break
        else:
            bins.append([i])
            loads.append(lengths[i])
    return [sorted(b) for b in bins]


def _flat_tokens(
    sequences: Sequence[Sequence[int] | torch.Tensor], indices: Sequence[int]
) -> tuple[list[int], torch.Tensor]:
    """The lengths of sequences[i] for i in indices, and their tokens laid end to end (int64); lists of ints are
    joined before one tensor is made of them (a tensor per sequence cost ~2 us each, twice that on the CPU's
    cuda-to-cpu mode)."""
    chosen = [sequences[i] for i in indices]
    if any(torch.is_tensor(s) for s in chosen):
        seqs = [torch.as_tensor(s, dtype=torch.long).flatten() for s in chosen]
        return [len(s) for s in seqs], torch.cat(seqs)
    return [len(s) for s in chosen], torch.tensor(list(chain.from_iterable(chosen)), dtype=torch.long)


def pack(
    sequences: Sequence[Sequence[int] | torch.Tensor], indices: Sequence[int], layout: str = "packed", multiple: int = 1
) -> MicroBatch:
    """Build one micro-batch from sequences[i] for i in indices in `layout` (see the module docstring).

    `multiple` pads each sequence ("thd") or the common row length ("padded") to a multiple of it.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if not indices:
        # A filler micro-batch (one token) keeps micro-batch counts equal across DP ranks.
        indices, lengths, flat_tokens = [-1], [1], torch.zeros(1, dtype=torch.long)
    else:
        lengths, flat_tokens = _flat_tokens(sequences, indices)
    n = len(lengths)
    # Built with whole-tensor operations: a per-sequence loop cost ~4 ms per micro-batch of 40 sequences.
    length_t = torch.tensor(lengths)
    slot_t = length_t if layout != "thd" else -(-length_t // multiple) * multiple  # room each sequence takes
    segment_of = torch.repeat_interleave(torch.arange(n), length_t)  # sequence of each real token, flat
    offsets = torch.cumsum(slot_t, 0) - slot_t
    flat_positions = torch.arange(int(length_t.sum())) - (torch.cumsum(length_t, 0) - length_t)[segment_of]
    if layout == "padded":
        rows, starts, shape = list(range(n)), [0] * n, (n, padded_length(max(lengths), multiple))
        where = (segment_of, flat_positions)
    else:
        rows, starts, shape = [0] * n, offsets.tolist(), (1, int(slot_t.sum()))
        where = (torch.zeros_like(segment_of), offsets[segment_of] + flat_positions)
    tokens = torch.zeros(shape, dtype=torch.long)
    tokens[where] = flat_tokens
    if layout == "thd":
        # Padding continues each sequence's positions (it is never attended to by real tokens).
        slot_of = torch.repeat_interleave(torch.arange(n), slot_t)
        position_ids = (torch.arange(shape[1]) - offsets[slot_of])[None]
        cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(slot_t, 0).to(torch.int32)])
        return MicroBatch(list(indices), rows, starts, lengths, tokens, position_ids, None, cu_seqlens)
    position_ids = torch.zeros(shape, dtype=torch.long)
    position_ids[where] = flat_positions
    # Position i of a sequence may attend to positions first..i of that sequence (first: where it starts in its
    # row); padding attends to nothing (its first is past the row). Masked out = j > i or j < first.
    first = torch.full(shape, shape[1], dtype=torch.long)
    first[where] = where[1] - flat_positions
    column = torch.arange(shape[1])
    masked = (column[None, None, :] > column[None, :, None]) | (column[None, None, :] < first[:, :, None])
    return MicroBatch(list(indices), rows, starts, lengths, tokens, position_ids, masked[:, None])
