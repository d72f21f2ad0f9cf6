"""The local spec's fused elementwise kernels (Triton through torch.compile) and grouped-GEMM experts on CUDA, in bf16,
against the modules they replace: each kernel alone, then whole tiny models (log-probs and gradients)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from slime_like.trainer.megatron.cpu_compat import transformer_engine_available

# With Transformer Engine make_bridge builds TE's spec, whose own fused modules run instead of these.
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(transformer_engine_available(), reason="TE installed: TE's spec")]
BF16 = {"atol": 2e-2, "rtol": 2e-2}
CUDA = "cuda"


@pytest.fixture(scope="module")
def world() -> None:
    """A world of one on this GPU (init_parallel keeps an existing one of the same sizes)."""
    from slime_like.trainer.megatron.parallel import init_parallel

    init_parallel(tp=1, pp=1, seed=1234)


def _grads(fn, *inputs: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*inputs)
    (out.float() * torch.linspace(-1, 1, out.numel(), device=out.device).reshape(out.shape)).sum().backward()
    return out.detach().float(), [t.grad.float() for t in inputs]


def _close(fused, reference, *inputs: torch.Tensor) -> None:
    out, grads = _grads(fused, *inputs)
    ref, ref_grads = _grads(reference, *inputs)
    torch.testing.assert_close(out, ref, **BF16)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, atol=2e-2 * want.abs().max().item(), rtol=0)


def test_kernels_match_references_in_bf16(world) -> None:
    from megatron.core import parallel_state as mpu
    from megatron.core.fusions.fused_bias_swiglu import bias_swiglu_impl
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd, _apply_rotary_pos_emb_thd
    from megatron.core.transformer.transformer_config import TransformerConfig

    from slime_like.trainer.megatron.fused_ops import (
        FusedRMSNorm,
        fused_apply_rotary_pos_emb,
        fused_apply_rotary_pos_emb_thd,
    )

    g = torch.Generator(device=CUDA).manual_seed(0)
    x = torch.randn(256, 2, 1024, device=CUDA, generator=g, dtype=torch.bfloat16)
    config = TransformerConfig(num_layers=1, hidden_size=1024, num_attention_heads=8, normalization="RMSNorm")
    fused = FusedRMSNorm(config, 1024, eps=1e-6).to(CUDA, torch.bfloat16)
    reference = torch.nn.RMSNorm(1024, eps=1e-6).to(CUDA, torch.bfloat16)
    _close(fused, reference, x)
    t = torch.randn(256, 2, 8, 128, device=CUDA, generator=g, dtype=torch.bfloat16)
    freqs = torch.randn(256, 1, 1, 128, device=CUDA, generator=g)
    _close(lambda t: fused_apply_rotary_pos_emb(t, freqs), lambda t: _apply_rotary_pos_emb_bshd(t, freqs), t)
    cu = torch.tensor([0, 100, 101, 256], device=CUDA, dtype=torch.int32)
    cp = mpu.get_context_parallel_group()
    _close(
        lambda t: fused_apply_rotary_pos_emb_thd(t, cu, freqs),
        lambda t: _apply_rotary_pos_emb_thd(t, cu, freqs, cp_group=cp),
        t[:, 0],
    )
    y = torch.randn(512, 2048, device=CUDA, generator=g, dtype=torch.bfloat16)
    _close(lambda y: bias_swiglu_impl(y, None), lambda y: F.silu(y.chunk(2, -1)[0]) * y.chunk(2, -1)[1], y)


def _model(hf_dir: Path, fused: bool, grouped: bool):
    from slime_like.trainer.megatron.local_kernels_flags import LocalKernels
    from slime_like.trainer.megatron.model import build_model, load_hf_weights, make_bridge

    kernels = LocalKernels(fused_elementwise=fused, grouped_experts=grouped)
    bridge = make_bridge(hf_dir, torch.bfloat16, local_kernels=kernels)
    model = build_model(bridge, wrap_with_ddp=False)
    load_hf_weights(bridge, model, hf_dir)
    return bridge, model[0]


def _logprobs_and_grads(model: torch.nn.Module, vocab: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    tokens = torch.randint(0, vocab, (2, 64), generator=torch.Generator().manual_seed(1)).to(CUDA)
    mask = ~torch.ones(64, 64, dtype=torch.bool, device=CUDA).tril()[None, None].expand(2, 1, 64, 64)
    logits = model(tokens, torch.arange(64, device=CUDA)[None].expand(2, 64), mask)
    logprobs = logits.float().log_softmax(-1)
    picked = logprobs[:, :-1].gather(-1, tokens[:, 1:, None]).squeeze(-1)
    picked.sum().backward()
    return picked.detach(), {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(
    ("fixture", "fused", "grouped"),
    [("tiny_qwen3", True, False), ("tiny_qwen3_moe", False, True), ("tiny_qwen3_moe", True, True)],
    ids=["dense-fused", "moe-grouped", "moe-fused-grouped"],
)
def test_fast_paths_match_reference_model_in_bf16(
    fixture: str, fused: bool, grouped: bool, request: pytest.FixtureRequest, world
) -> None:
    hf_dir = request.getfixturevalue(fixture)
    ref_bridge, ref = _model(hf_dir, False, False)
    bridge, fast = _model(hf_dir, fused, grouped)
    assert bool(bridge.config.apply_rope_fusion) == fused and not ref_bridge.config.apply_rope_fusion
    ref_lp, ref_grads = _logprobs_and_grads(ref, ref_bridge.hf_config.vocab_size)
    lp, grads = _logprobs_and_grads(fast, bridge.hf_config.vocab_size)
    torch.testing.assert_close(lp, ref_lp, atol=5e-2, rtol=0)
    assert list(grads) == list(ref_grads)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], atol=5e-2 * ref_grads[name].abs().max().item(), rtol=0)
