"""Split a batch of variable-length sequences over DP ranks and micro-batches, and pack micro-batches.

A packed micro-batch puts several whole sequences in one row with a block-diagonal causal mask and
per-sequence position ids (RoPE is relative, so packed log-probs match separate forwards to ~5e-7).
Sequences are never split. The "padded" layout (one right-padded row per sequence, plain causal
attention) is for attention kernels that ignore an explicit mask (Transformer Engine's causal mode).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class MicroBatch:
    """Token rows of one micro-batch, and where each sequence sits in them."""

    indices: list[int]  # index of each sequence in the caller's batch (-1: filler, no loss)
    rows: list[int]
    starts: list[int]
    lengths: list[int]
    tokens: torch.Tensor  # [rows, T] int64
    position_ids: torch.Tensor  # [rows, T] int64
    attention_mask: torch.Tensor  # [rows, 1, T, T] bool, True = masked out (Megatron's convention)

    @property
    def num_tokens(self) -> int:
        """Real (unpadded) tokens in the micro-batch."""
        return sum(self.lengths)

    def per_sequence(self, values: torch.Tensor) -> list[torch.Tensor]:
        """Cut a [rows, T] per-position tensor into per-sequence predictions of tokens 1..L-1.

        Position j holds the prediction of token j+1, so sequence k gets values[start : start+L-1].
        """
        return [
            values[row, start : start + length - 1]
            for idx, row, start, length in zip(self.indices, self.rows, self.starts, self.lengths, strict=True)
            if idx >= 0
        ]


def split_for_dp(lengths: Sequence[int], dp_size: int) -> list[list[int]]:
    """Deterministic token-balanced partition of sequence indices over DP ranks (each in input order).

    Longest first, each to the rank with the fewest tokens so far (ties: fewest sequences, lowest rank).
    With fewer sequences than ranks some shares are empty (the engine runs a filler micro-batch there).
    """
    shares: list[list[int]] = [[] for _ in range(dp_size)]
    tokens = [0] * dp_size
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        rank = min(range(dp_size), key=lambda r: (tokens[r], len(shares[r]), r))
        shares[rank].append(i)
        tokens[rank] += lengths[i]
    return [sorted(s) for s in shares]


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


def pack(sequences: Sequence[torch.Tensor], indices: Sequence[int], layout: str = "packed") -> MicroBatch:
    """Build one micro-batch from sequences[i] for i in indices ("packed": one row; "padded": a row each)."""
    seqs = [torch.as_tensor(sequences[i], dtype=torch.long).flatten() for i in indices]
    if not seqs:
        # A filler micro-batch (one token) keeps micro-batch counts equal across DP ranks.
        seqs, indices = [torch.zeros(1, dtype=torch.long)], [-1]
    lengths = [len(s) for s in seqs]
    n = len(seqs)
    # Built with whole-tensor operations: a per-sequence loop cost ~4 ms per micro-batch of 40 sequences.
    length_t = torch.tensor(lengths)
    segment_of = torch.repeat_interleave(torch.arange(n), length_t)  # sequence of each token, flat
    offsets = torch.cumsum(length_t, 0) - length_t
    flat_positions = torch.arange(int(length_t.sum())) - offsets[segment_of]
    flat_tokens = torch.cat(seqs)
    if layout == "packed":
        rows, starts, shape = [0] * n, offsets.tolist(), (1, int(length_t.sum()))
        where = (torch.zeros_like(segment_of), torch.arange(shape[1]))
    elif layout == "padded":
        rows, starts, shape = list(range(n)), [0] * n, (n, max(lengths))
        where = (segment_of, flat_positions)
    else:
        raise ValueError(f"layout must be 'packed' or 'padded', got {layout!r}")
    tokens = torch.zeros(shape, dtype=torch.long)
    position_ids = torch.zeros(shape, dtype=torch.long)
    segment = torch.full(shape, -1, dtype=torch.long)
    tokens[where] = flat_tokens
    position_ids[where] = flat_positions
    segment[where] = segment_of
    same = segment[:, :, None] == segment[:, None, :]
    causal = torch.ones(shape[1], shape[1], dtype=torch.bool).tril()
    allowed = same & causal & (segment >= 0)[:, :, None]
    return MicroBatch(list(indices), rows, starts, lengths, tokens, position_ids, ~allowed[:, None])
