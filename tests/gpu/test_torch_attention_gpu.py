"""CUDA: torch's varlen and compiled flex attention against the math reference in bf16 (outputs and gradients), the
call-by-call fallback of fp32 varlen to flex, the memory of an 8192-token packed micro-batch, and the engine's
default on CUDA without Transformer Engine, Qwen3-Next / Qwen3.5 included."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from slime_like.trainer.megatron.torch_attention import choose_attention, thd_attention
from tests.megatron.test_torch_attention import allowed

CU = [0, 100, 357, 640, 1000]
SCALE = 1 / 8.0  # head size 64


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Math attention in fp32 of [T, H, D] q and [T, G, D] k/v with a [T, T] keep-mask."""
    group = q.shape[1] // k.shape[1]
    q, k, v = q.float(), k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    probs = torch.softmax((torch.einsum("thd,shd->hts", q, k) * SCALE).masked_fill(~keep, float("-inf")), -1)
    return torch.einsum("hts,shd->thd", probs, v)


def qkv(total: int, heads: int, groups: int, dtype: torch.dtype, dim: int = 64) -> list[torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    shapes = [(total, heads, dim), (total, groups, dim), (total, groups, dim)]
    return [torch.randn(s, generator=gen, device="cuda", dtype=dtype).requires_grad_() for s in shapes]


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["varlen", "flex", "sdpa"])
@pytest.mark.parametrize("window", [None, 64], ids=["causal", "window64"])
def test_paths_match_the_reference_in_bf16(path, window) -> None:
    q, k, v = qkv(CU[-1], 8, 2, torch.bfloat16)
    cu = torch.tensor(CU, dtype=torch.int32, device="cuda")
    out, ran = thd_attention(path, q, k, v, cu, SCALE, window)
    assert ran == path
    keep = allowed(CU, CU[-1], window).cuda()
    expected = reference(q, k, v, keep)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)
    weights = torch.randn_like(expected)
    got = torch.autograd.grad((out.float() * weights).sum(), (q, k, v))
    want = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.float(), w, atol=5e-2, rtol=5e-2)


@pytest.mark.gpu
def test_fp32_varlen_falls_back_to_flex() -> None:
    q, k, v = qkv(CU[-1], 8, 2, torch.float32)
    out, ran = thd_attention("varlen", q, k, v, torch.tensor(CU, device="cuda"), SCALE)
    assert ran == "flex"  # Flash Attention takes fp16/bf16 only
    torch.testing.assert_close(out, reference(q, k, v, allowed(CU, CU[-1], None).cuda()), atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["varlen", "flex"])
def test_8192_token_micro_batch_stays_far_below_dense_scores(path) -> None:
    """32 heads x 8192^2 bf16 scores alone are 4 GiB (the local spec keeps fp32 scores and probabilities, 16 GiB):
    torch's paths must run forward and backward within 1 GiB over the inputs."""
    total, heads = 8192, 32
    q, k, v = qkv(total, heads, 8, torch.bfloat16, dim=128)
    cu = torch.tensor([0, 1000, 3000, 6000, 8192], dtype=torch.int32, device="cuda")
    thd_attention(path, q, k, v, cu, SCALE)  # compile / warm up
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out, ran = thd_attention(path, q, k, v, cu, SCALE)
    out.sum().backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    assert ran == path
    assert extra < 2**30, f"{path}: {extra / 2**20:.0f} MiB over the inputs"


@pytest.mark.gpu
def test_cuda_without_te_defaults_to_varlen() -> None:
    te = importlib.util.find_spec("transformer_engine") is not None
    assert choose_attention("auto", cuda=True, transformer_engine=te) == (None if te else "varlen")


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5_moe"])
def test_hybrid_engine_defaults_to_varlen_and_matches_the_packed_layout(family, tiny_qwen3, tmp_path) -> None:
    """Qwen3-Next / Qwen3.5 on CUDA without TE: varlen in the gated attention layers and THD micro-batches by default,
    with the log-probs of Megatron's local attention on a packed row (bf16; fla runs the gated delta nets)."""
    pytest.importorskip("fla", reason="flash-linear-attention is not installed")
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.parallel import init_parallel
    from slime_like.trainer.megatron.torch_attention import attention_paths
    from tests.megatron.common import fixed_batch
    from tests.megatron.tiny_families import make_qwen3_5, make_qwen3_next

    if importlib.util.find_spec("transformer_engine") is not None:
        pytest.skip("TE installed: TE's spec and attention")
    init_parallel(tp=1, pp=1, seed=1234)
    make = make_qwen3_next if family == "qwen3_next" else lambda out, tok: make_qwen3_5(out, tok, moe=True)
    hf_dir = make(tmp_path / family, tiny_qwen3)
    seqs = fixed_batch()
    ours = MegatronTrainEngine(hf_dir, None, max_tokens_per_micro_batch=40, dtype=torch.bfloat16)
    got = ours.forward_logprobs(seqs)
    assert ours.layout == "thd" and attention_paths(ours.model) == ["varlen"]
    local = MegatronTrainEngine(
        hf_dir, None, max_tokens_per_micro_batch=40, dtype=torch.bfloat16, torch_attention="off"
    )
    assert local.layout == "packed"
    for a, b in zip(got, local.forward_logprobs(seqs), strict=True):
        torch.testing.assert_close(a.float(), b.float(), atol=5e-2, rtol=0)
