"""torch's core attention (flex, per-sequence SDPA, SBHD SDPA) against an explicit softmax(QK^T * scale) with a
causal per-document (and windowed) mask built here, GQA included, gradients where torch has them on the CPU; its
block mask against torch's create_block_mask; the module against Megatron's local DotProductAttention; and a tiny
model's packed log-probs and a train step with it against today's local spec."""

from __future__ import annotations

import math

import pytest
import torch

from slime_like.trainer.megatron.torch_attention import (
    attention_paths,
    document_block_mask,
    sbhd_attention,
    thd_attention,
)
from tests.megatron.common import fixed_batch, num_targets, token_ce_loss
from tests.megatron.test_fused_ops import checkpoint_of

CU = [0, 7, 7, 20, 33, 48]  # an empty sequence among them
SCALE = 1 / math.sqrt(16)


def allowed(cu: list[int], total: int, window: int | None) -> torch.Tensor:
    """[T, T] bool, True = query t sees key s: same sequence, s <= t, t - s <= window."""
    doc = torch.zeros(total, dtype=torch.long)
    for i, (a, b) in enumerate(zip(cu[:-1], cu[1:], strict=True)):
        doc[a:b] = i
    t = torch.arange(total)
    ok = (doc[:, None] == doc[None, :]) & (t[None, :] <= t[:, None])
    return ok if window is None else ok & (t[:, None] - t[None, :] <= window)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Math attention of [T, H, D] q and [T, G, D] k/v (query head h reads kv group h // (H/G)), [T, T] keep."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,shd->hts", q, k) * SCALE
    probs = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
    return torch.einsum("hts,shd->thd", probs, v)


def qkv(total: int, heads: int, groups: int, grad: bool = False, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(total, heads, 16), (total, groups, 16), (total, groups, 16)]
    return [torch.randn(s, generator=gen).requires_grad_(grad) for s in shapes]


@pytest.mark.parametrize("window", [None, 20], ids=["causal", "window20"])
def test_document_block_mask_matches_create_block_mask(window) -> None:
    from torch.nn.attention.flex_attention import create_block_mask

    cu, total = [0, 37, 37, 100, 150], 150  # 150 is no multiple of the block: a partial last block
    keep = allowed(cu, total, window)
    ours = document_block_mask(torch.tensor(cu, dtype=torch.int32), total, window, block=16)
    theirs = create_block_mask(lambda b, h, q, k: keep[q, k], None, None, total, total, device="cpu", BLOCK_SIZE=16)
    for counts, indices in (("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices")):
        a_num, b_num = getattr(ours, counts)[0, 0], getattr(theirs, counts)[0, 0]
        assert a_num.tolist() == b_num.tolist(), counts
        a_idx, b_idx = getattr(ours, indices)[0, 0], getattr(theirs, indices)[0, 0]
        for row, n in enumerate(a_num.tolist()):
            assert sorted(a_idx[row, :n].tolist()) == sorted(b_idx[row, :n].tolist()), (indices, row)
    assert ours.to_dense().tolist() == theirs.to_dense().tolist()


@pytest.mark.parametrize("groups", [2, 4], ids=["gqa", "mha"])
@pytest.mark.parametrize("window", [None, 5], ids=["causal", "window5"])
def test_thd_flex_and_sdpa_match_the_math_reference(groups, window) -> None:
    q, k, v = qkv(CU[-1], 4, groups)
    cu = torch.tensor(CU, dtype=torch.int32)
    expected = reference(q, k, v, allowed(CU, CU[-1], window))
    for path in ("flex", "sdpa", "varlen"):  # varlen (CUDA only) falls back to flex on the CPU
        out, ran = thd_attention(path, q, k, v, cu, SCALE, window)
        assert ran == ("flex" if path == "varlen" else path)
        assert out.shape == q.shape
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("window", [None, 5], ids=["causal", "window5"])
def test_thd_gradients_match_the_math_reference(window) -> None:
    q, k, v = qkv(CU[-1], 4, 2, grad=True)
    weights = torch.randn(CU[-1], 4, 16, generator=torch.Generator().manual_seed(1))
    out, ran = thd_attention("flex", q, k, v, torch.tensor(CU), SCALE, window)
    assert ran == "sdpa"  # torch has no flex backward on the CPU: the call runs per-sequence SDPA
    got = torch.autograd.grad((out * weights).sum(), (q, k, v))
    expected = torch.autograd.grad((reference(q, k, v, allowed(CU, CU[-1], window)) * weights).sum(), (q, k, v))
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=0)


def test_thd_rows_past_the_last_boundary_are_a_sequence_of_their_own() -> None:
    q, k, v = qkv(40, 4, 2)
    expected = reference(q, k, v, allowed([0, 30, 40], 40, None))
    for path in ("flex", "sdpa"):
        out, _ = thd_attention(path, q, k, v, torch.tensor([0, 30]), SCALE)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("window", [None, 4], ids=["causal", "window4"])
def test_sbhd_sdpa_matches_the_math_reference(window) -> None:
    seq, batch = 24, 2
    q, k, v = (x.view(batch, seq, *x.shape[1:]).transpose(0, 1).detach().requires_grad_() for x in qkv(48, 4, 2))
    weights = torch.randn(seq, batch, 4, 16, generator=torch.Generator().manual_seed(2))
    packed = ~allowed([0, 10, 24], seq, None)[None, None]  # Megatron's bool mask: True = masked out
    for mask, cu in ((None, [0, seq]), (packed, [0, 10, 24])):
        out = sbhd_attention(q, k, v, mask, True, SCALE, window)
        assert out.shape == (seq, batch, 4, 16)
        for b in range(batch):
            keep = allowed(cu, seq, window)
            expected = reference(q[:, b], k[:, b], v[:, b], keep)
            torch.testing.assert_close(out[:, b], expected, atol=1e-5, rtol=0)
            got = torch.autograd.grad((out[:, b] * weights[:, b]).sum(), (q, k, v), retain_graph=True)
            want = torch.autograd.grad((expected * weights[:, b]).sum(), (q, k, v))
            for g, e in zip(got, want, strict=True):
                torch.testing.assert_close(g, e, atol=1e-5, rtol=0)


def test_module_matches_megatron_local_attention_in_both_layouts(megatron_world) -> None:
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from slime_like.trainer.megatron.torch_attention import torch_core_attention

    config = TransformerConfig(
        num_layers=1, hidden_size=64, num_attention_heads=4, num_query_groups=2, kv_channels=16,
        attention_dropout=0.0, masked_softmax_fusion=False, use_cpu_initialization=True,
    )  # fmt: skip
    args = (config, 1, AttnMaskType.causal, "self")
    local, ours = DotProductAttention(*args), torch_core_attention("sdpa")(*args)
    q, k, v = qkv(CU[-1], 4, 2)
    mask = ~allowed(CU, CU[-1], None)[None, None]
    expected = local(q[:, None], k[:, None], v[:, None], mask)  # the local spec's packed layout: [T, 1, H*D]
    torch.testing.assert_close(ours(q[:, None], k[:, None], v[:, None], mask), expected, atol=1e-5, rtol=0)
    cu = torch.tensor(CU, dtype=torch.int32)
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=15, max_seqlen_kv=15)
    out = ours(q, k, v, None, packed_seq_params=params)
    assert out.shape == (CU[-1], 1, 64) and ours.last_path == "sdpa"
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def local_engine(tiny_qwen3, megatron_world):
    """Today's CPU engine: Megatron's local attention on "packed" micro-batches (a block-diagonal [T, T] mask)."""
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.optimizer import OptimizerSettings

    return MegatronTrainEngine(tiny_qwen3, OptimizerSettings(lr=1e-3), max_tokens_per_micro_batch=40)


def test_tiny_model_logprobs_and_step_match_the_local_spec(local_engine, tiny_qwen3) -> None:
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.optimizer import OptimizerSettings

    seqs = fixed_batch()
    assert local_engine.layout == "packed" and attention_paths(local_engine.model) == []
    expected = local_engine.forward_logprobs(seqs)
    for path in ("flex", "sdpa"):
        engine = MegatronTrainEngine(tiny_qwen3, max_tokens_per_micro_batch=40, torch_attention=path)
        got = engine.forward_logprobs(seqs)
        assert engine.layout == "thd" and attention_paths(engine.model) == [path]
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    # A train step (backward through per-sequence SDPA) gives the local spec's loss and gradient norm.
    engine = MegatronTrainEngine(
        tiny_qwen3, OptimizerSettings(lr=1e-3), max_tokens_per_micro_batch=40, torch_attention="sdpa"
    )
    loss_fn = token_ce_loss(num_targets(seqs))
    ours = engine.train_step(seqs, [None] * len(seqs), loss_fn)
    theirs = local_engine.train_step(seqs, [None] * len(seqs), loss_fn)
    assert ours["loss"] == pytest.approx(theirs["loss"], abs=1e-6)
    assert ours["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-5)


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5_moe"])
def test_hybrid_model_logprobs_and_step_match_the_local_spec(
    family: str, request: pytest.FixtureRequest, megatron_world
) -> None:
    """Qwen3-Next / Qwen3.5's gated attention layers on torch's SDPA, their gated delta nets split by cu_seqlens (THD),
    against the local spec's packed row (block-diagonal mask): log-probs, then a train step's loss and gradient norm."""
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.optimizer import OptimizerSettings

    hf_dir = checkpoint_of(family, request)
    seqs = fixed_batch()
    loss_fn = token_ce_loss(num_targets(seqs))
    results = []
    # Megatron compiles the gated norm and the attention output gate (jit_fuser): their eager bodies here, as
    # compiling them on the CPU costs ~9 s and both layouts run the same ones.
    with torch._dynamo.config.patch(disable=True):
        for path in (None, "sdpa"):
            engine = MegatronTrainEngine(
                hf_dir, OptimizerSettings(lr=1e-3), max_tokens_per_micro_batch=40, torch_attention=path
            )
            assert engine.layout == ("thd" if path else "packed")
            logprobs = engine.forward_logprobs(seqs)
            assert attention_paths(engine.model) == ([path] if path else [])
            results.append((logprobs, engine.train_step(seqs, [None] * len(seqs), loss_fn)))
    (local, local_step), (ours, step) = results
    for a, b in zip(ours, local, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert step["loss"] == pytest.approx(local_step["loss"], abs=1e-6)
    assert step["grad_norm"] == pytest.approx(local_step["grad_norm"], rel=1e-5)
