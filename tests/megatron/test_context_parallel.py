"""Zig-zag context parallel: the split/reassembly index math, and on two gloo ranks the autograd gather
and loss scaling against one process (the CP=2 transformer forward itself needs TE: tests/gpu)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from slime_like.trainer.megatron.context_parallel import shard, zigzag_positions
from slime_like.trainer.megatron.packing import pack
from tests.megatron.launch import torchrun

WORKER = Path(__file__).with_name("cp_worker.py")


def test_zigzag_one_sequence_of_eight_tokens():
    cu = torch.tensor([0, 8], dtype=torch.int32)
    assert zigzag_positions(cu, 2, 0).tolist() == [0, 1, 6, 7]
    assert zigzag_positions(cu, 2, 1).tolist() == [2, 3, 4, 5]


def test_zigzag_several_sequences_and_three_ranks():
    cu = torch.tensor([0, 8, 12], dtype=torch.int32)  # chunks of 2 and of 1 at cp=2
    assert zigzag_positions(cu, 2, 0).tolist() == [0, 1, 6, 7, 8, 11]
    assert zigzag_positions(cu, 2, 1).tolist() == [2, 3, 4, 5, 9, 10]
    cu = torch.tensor([0, 12], dtype=torch.int32)  # six chunks of 2 at cp=3
    assert [zigzag_positions(cu, 3, r).tolist() for r in range(3)] == [
        [0, 1, 10, 11],
        [2, 3, 8, 9],
        [4, 5, 6, 7],
    ]
    with pytest.raises(ValueError, match="multiple of 2 \\* cp = 4"):
        zigzag_positions(torch.tensor([0, 6]), 2, 0)


def test_shard_targets_come_from_the_full_sequence_and_order_reassembles():
    # Sequences of 6 and 3 tokens, padded to 8 and 4 (multiples of 2 * cp).
    mb = pack([torch.arange(10, 16), torch.arange(20, 23)], [0, 1], layout="thd", multiple=4)
    assert mb.tokens.tolist() == [[10, 11, 12, 13, 14, 15, 0, 0, 20, 21, 22, 0]]
    rank0, rank1 = shard(mb, 2, 0), shard(mb, 2, 1)
    assert rank0.tokens.tolist() == [[10, 11, 0, 0, 20, 0]]
    assert rank1.tokens.tolist() == [[12, 13, 14, 15, 21, 22]]
    assert rank0.position_ids.tolist() == [[0, 1, 6, 7, 0, 3]]
    assert rank1.position_ids.tolist() == [[2, 3, 4, 5, 1, 2]]
    # Position 1 (token 11) predicts token 12, which lives on the other rank: not a roll of the chunk.
    assert rank0.targets[0, :2].tolist() == [11, 12] and rank0.targets[0, 4].tolist() == 21
    assert rank1.targets[0, :3].tolist() == [13, 14, 15] and rank1.targets[0, 4].tolist() == 22
    # Each rank's per-position values, concatenated in rank order, go back to full positions through order.
    full = torch.arange(12.0)[None] * 10
    local = [full[:, zigzag_positions(mb.cu_seqlens, 2, r)] for r in range(2)]
    assert torch.equal(torch.cat(local, dim=-1)[:, rank0.order], full)
    with pytest.raises(ValueError, match="'thd' layout"):
        shard(pack([torch.arange(4)], [0], layout="packed"), 2, 0)


def _single_process(seqs: list[torch.Tensor]) -> dict:
    """The same toy model, loss and micro-batches in one process without CP: outputs and gradients."""
    from tests.megatron.common import num_targets
    from tests.megatron.cp_worker import logits_of, loss_share, micro_batches, toy_model

    model = toy_model()
    logprobs, entropies = [], []
    for mb in micro_batches(seqs, cp=2):  # the same padding as the CP run
        # Written out rather than through logprobs.py, so that the reference is independent of the worker.
        log_p = torch.log_softmax(logits_of(model, mb.tokens).float(), dim=-1)
        lp = log_p.gather(-1, mb.targets.unsqueeze(-1)).squeeze(-1)
        ent = -(log_p.exp() * log_p).sum(-1)
        lp_seq, ent_seq = mb.per_sequence(lp), mb.per_sequence(ent)
        logprobs += [x.detach() for x in lp_seq]
        entropies += [x.detach() for x in ent_seq]
        loss_share(lp_seq, ent_seq, num_targets(seqs)).backward()
    return {"logprobs": logprobs, "entropy": entropies, "grads": {n: p.grad for n, p in model.named_parameters()}}


def test_cp2_gather_and_gradients_match_one_process(tiny_qwen3, tmp_path):
    from tests.megatron.common import fixed_batch

    torchrun(WORKER, [str(tmp_path), str(tiny_qwen3)])
    ref = _single_process(fixed_batch())
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for rank, got in enumerate(ranks):
        assert len(got["logprobs"]) == len(ref["logprobs"])
        for key in ("logprobs", "entropy"):  # every CP rank holds the full per-sequence outputs
            for g, r in zip(got[key], ref[key], strict=True):
                torch.testing.assert_close(g, r, atol=1e-5, rtol=0, msg=f"rank {rank} {key}")
        for name, grad in got["grads"].items():  # counted once: not cp times, not 1/cp
            torch.testing.assert_close(grad, ref["grads"][name], atol=1e-6, rtol=1e-5, msg=f"rank {rank} {name}")
        assert "--context-parallel-size 2" in got["refusal"] and "Transformer Engine" in got["refusal"]
    # The ranks really held different halves of each micro-batch.
    assert not torch.equal(ranks[0]["tokens"][0], ranks[1]["tokens"][0])
