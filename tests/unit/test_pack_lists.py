"""packing.pack from token lists (the trainer's TrainData.tokens) and from tensors: the same micro-batch, and the
packed mask is the block-diagonal causal one, built by its definition here."""

from __future__ import annotations

import pytest
import torch

from slime_like.trainer.megatron.packing import pack

SEQUENCES = [[5, 6, 7], [8, 9], [1, 2, 3, 4], [3]]


@pytest.mark.parametrize("layout", ["packed", "padded", "thd"])
def test_lists_and_tensors_pack_alike(layout: str) -> None:
    for indices in ([0, 2, 3], [1], []):
        a = pack(SEQUENCES, indices, layout, multiple=4)
        b = pack([torch.tensor(s) for s in SEQUENCES], indices, layout, multiple=4)
        assert (a.indices, a.rows, a.starts, a.lengths) == (b.indices, b.rows, b.starts, b.lengths)
        for name in ("tokens", "position_ids", "attention_mask", "cu_seqlens"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None and y is None) or (x.dtype == y.dtype and torch.equal(x, y)), name


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_mask_lets_each_token_see_its_own_sequence_up_to_itself(layout: str) -> None:
    mb = pack(SEQUENCES, [0, 1, 2], layout, multiple=4)
    rows, width = mb.tokens.shape
    allowed = torch.zeros(rows, width, width, dtype=torch.bool)
    for row, start, length in zip(mb.rows, mb.starts, mb.lengths, strict=True):
        for i in range(start, start + length):
            allowed[row, i, start : i + 1] = True
    assert mb.attention_mask.shape == (rows, 1, width, width)
    assert torch.equal(mb.attention_mask[:, 0], ~allowed)  # True = masked out; padding sees nothing


@pytest.mark.parametrize("layout", ["packed", "padded", "thd"])
def test_per_sequence_without_a_graph_cuts_as_with_one(layout: str) -> None:
    # Log-prob forwards (no graph) split the flat values once; training slices each sequence: the same pieces.
    for indices in ([0, 2, 3], [1], [], [3, 0]):
        mb = pack(SEQUENCES, indices, layout, multiple=4)
        for shape in (mb.tokens.shape, (*mb.tokens.shape, 3)):
            values = torch.randn(shape)
            cut = mb.per_sequence(values)
            sliced = mb.per_sequence(values.clone().requires_grad_())
            assert len(cut) == len(sliced) == len([i for i in mb.indices if i >= 0])
            for a, b in zip(cut, sliced, strict=True):
                assert a.shape == b.shape and torch.equal(a, b.detach())
