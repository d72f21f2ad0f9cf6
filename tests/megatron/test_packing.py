"""Packing (packed, thd, padded layouts) and DP/micro-batch splitting; packed engine forwards equal separate
forwards and transformers."""

from __future__ import annotations

import pytest
import torch

from slime_like.trainer.megatron.packing import pack, pad_multiple, split_for_dp, split_micro_batches
from slime_like.trainer.megatron.schedule import choose_layout
from tests.megatron.common import fixed_batch, num_targets, token_ce_loss


def test_split_for_dp_balances_tokens_and_covers_all():
    lengths = [5, 17, 9, 30, 2, 12, 21, 7]
    shares = split_for_dp(lengths, 2)
    assert sorted(i for s in shares for i in s) == list(range(8))
    loads = [sum(lengths[i] for i in s) for s in shares]
    assert abs(loads[0] - loads[1]) <= max(lengths) and shares == split_for_dp(lengths, 2)
    assert split_for_dp([4], 2) == [[0], []]


def test_micro_batches_respect_max_tokens_and_never_split():
    lengths = [5, 17, 9, 30, 2, 12, 21, 7, 50]
    bins = split_micro_batches(range(9), lengths, 40)
    assert sorted(i for b in bins for i in b) == list(range(9))
    assert [8] in bins  # longer than the bound: alone
    assert all(sum(lengths[i] for i in b) <= 40 for b in bins if b != [8])


def test_pack_block_diagonal_mask_and_positions():
    mb = pack([torch.tensor([1, 2, 3]), torch.tensor([4, 5])], [0, 1])
    assert mb.tokens.tolist() == [[1, 2, 3, 4, 5]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 0, 1]]
    allowed = (~mb.attention_mask[0, 0]).int().tolist()
    assert allowed == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]]
    values = torch.arange(5.0)[None]
    assert [v.tolist() for v in mb.per_sequence(values)] == [[0.0, 1.0], [3.0]]
    padded = pack([torch.tensor([1, 2, 3]), torch.tensor([4, 5])], [0, 1], layout="padded")
    assert padded.tokens.tolist() == [[1, 2, 3], [4, 5, 0]]
    assert [v.tolist() for v in padded.per_sequence(torch.arange(6.0).view(2, 3))] == [[0.0, 1.0], [3.0]]


def test_thd_pads_each_sequence_and_gives_cu_seqlens():
    mb = pack([torch.tensor([1, 2, 3]), torch.tensor([4, 5])], [0, 1], layout="thd", multiple=4)
    assert mb.tokens.tolist() == [[1, 2, 3, 0, 4, 5, 0, 0]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3]]
    assert mb.attention_mask is None and mb.starts == [0, 4] and mb.num_tokens == 5
    assert mb.cu_seqlens.dtype == torch.int32 and mb.cu_seqlens.tolist() == [0, 4, 8]
    # Each sequence's predictions of its tokens 1..L-1, whatever padding follows it.
    assert [v.tolist() for v in mb.per_sequence(torch.arange(8.0)[None])] == [[0.0, 1.0], [4.0]]
    assert mb.targets.tolist() == [[2, 3, 0, 4, 5, 0, 0, 1]]
    params = mb.packed_seq_params()
    assert params.qkv_format == "thd" and params.max_seqlen_q == params.max_seqlen_kv == 4
    assert params.cu_seqlens_q.tolist() == params.cu_seqlens_kv.tolist() == [0, 4, 8]
    assert params.cu_seqlens_q_padded is None  # cu_seqlens already count the padding
    unpadded = pack([torch.tensor([1, 2, 3]), torch.tensor([4, 5])], [0, 1], layout="thd")
    assert unpadded.tokens.tolist() == [[1, 2, 3, 4, 5]] and unpadded.cu_seqlens.tolist() == [0, 3, 5]
    assert pack([torch.tensor([1, 2, 3])], [0], layout="packed").packed_seq_params() is None


def test_padded_layout_pads_rows_to_the_multiple():
    mb = pack([torch.tensor([1, 2, 3]), torch.tensor([4, 5])], [0, 1], layout="padded", multiple=4)
    assert mb.tokens.tolist() == [[1, 2, 3, 0], [4, 5, 0, 0]]
    assert [v.tolist() for v in mb.per_sequence(torch.arange(8.0).view(2, 4))] == [[0.0, 1.0], [4.0]]
    with pytest.raises(ValueError, match="layout must be one of"):
        pack([torch.tensor([1])], [0], layout="bshd")


def test_pad_multiple_covers_cp_halves_and_sp_ranks():
    assert pad_multiple() == 1
    assert pad_multiple(tp_size=4) == 1  # without sequence parallel TP does not split the sequence
    assert pad_multiple(tp_size=4, sequence_parallel=True) == 4
    assert pad_multiple(cp_size=2) == 4
    assert pad_multiple(tp_size=2, cp_size=2, sequence_parallel=True) == 8


def test_layout_choice_follows_the_attention_kernel(monkeypatch):
    assert choose_layout(None, transformer_engine=True) == "thd"
    assert choose_layout(None, transformer_engine=False) == "packed"
    assert choose_layout("padded", transformer_engine=True) == "padded"
    monkeypatch.setenv("SLIME_LIKE_MICRO_BATCH_LAYOUT", "padded")
    assert choose_layout(None, transformer_engine=True) == "padded"
    with pytest.raises(ValueError, match="'thd'.*Megatron's local attention"):
        choose_layout("thd", transformer_engine=False)
    with pytest.raises(ValueError, match="'packed'.*Transformer Engine"):
        choose_layout("packed", transformer_engine=True)


@pytest.fixture
def engine(tiny_qwen3, megatron_world):
    """A fresh engine (training changes its weights)."""
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.optimizer import OptimizerSettings

    return MegatronTrainEngine(tiny_qwen3, OptimizerSettings(lr=1e-3), max_tokens_per_micro_batch=40)


def _reference(hf_dir, seqs, entropy_coef: float = 0.0):
    """Per-sequence log-probs, entropies, and loss and grad norm of token_ce_loss, from transformers."""
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    logprobs, entropies, loss = [], [], 0.0
    for seq in seqs:
        logp = torch.log_softmax(hf(seq[None]).logits[0, :-1], dim=-1)
        logprobs.append(logp.gather(-1, seq[1:, None])[:, 0])
        entropies.append(-(logp.exp() * logp).sum(-1))
        loss = loss - (logprobs[-1].sum() + entropy_coef * entropies[-1].sum()) / num_targets(seqs)
    loss.backward()
    grad_norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in hf.parameters()))
    return [x.detach() for x in logprobs], [x.detach() for x in entropies], loss.item(), grad_norm.item()


def test_packed_logprobs_match_separate_forwards_and_transformers(engine, tiny_qwen3):
    seqs = fixed_batch()
    from slime_like.trainer.megatron.engine import MegatronTrainEngine

    packed, entropy = engine.forward_logprobs(seqs, with_entropy=True)
    # A forward-only engine (no DDP, no optimizer) with one sequence per micro-batch.
    separate = MegatronTrainEngine(tiny_qwen3, max_tokens_per_micro_batch=1).forward_logprobs(seqs)
    ref_logprobs, ref_entropy, _, _ = _reference(tiny_qwen3, seqs)
    for got, sep, ref, ent, ref_ent, seq in zip(
        packed, separate, ref_logprobs, entropy, ref_entropy, seqs, strict=True
    ):
        assert got.shape == (len(seq) - 1,)
        torch.testing.assert_close(got, sep, atol=2e-6, rtol=0)
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
        torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=0)


def test_padded_layout_logprobs_match_packed(engine, tiny_qwen3):
    """The padded fallback on the local spec (explicit right-padded causal mask) gives the packed results."""
    from slime_like.trainer.megatron.engine import MegatronTrainEngine

    seqs = fixed_batch()
    padded = MegatronTrainEngine(tiny_qwen3, max_tokens_per_micro_batch=40, layout="padded")
    assert padded.layout == "padded" and engine.layout == "packed"
    for got, ref in zip(padded.forward_logprobs(seqs), engine.forward_logprobs(seqs), strict=True):
        torch.testing.assert_close(got, ref, atol=2e-6, rtol=0)


@pytest.mark.parametrize("entropy_coef", [0.0, 0.5])
def test_train_step_gradient_matches_transformers(entropy_coef, engine, tiny_qwen3):
    seqs = fixed_batch()
    _, _, ref_loss, ref_grad_norm = _reference(tiny_qwen3, seqs, entropy_coef)
    loss_fn = token_ce_loss(num_targets(seqs), entropy_coef)
    metrics = engine.train_step(seqs, [None] * len(seqs), loss_fn, with_entropy=entropy_coef > 0)
    assert metrics["loss"] == pytest.approx(ref_loss, abs=1e-5)
    assert metrics["grad_norm"] == pytest.approx(ref_grad_norm, rel=1e-5)
    assert metrics["tokens"] == num_targets(seqs) and metrics["lr"] == pytest.approx(1e-3)
