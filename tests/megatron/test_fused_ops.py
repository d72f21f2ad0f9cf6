"""The fused elementwise paths of the local spec (fused_ops.py) against the modules and math they replace.

Kernel tests run the torch.compile'd functions (inductor compiles C++ on this CPU); the model test checks the wiring
(modules swapped, Megatron's fusion switches on, names unchanged) with dynamo disabled, i.e. the same functions'
eager bodies, so the suite does not compile a whole model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

TOL = {"atol": 1e-6, "rtol": 1e-6}


def _config(**kw):
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, normalization="RMSNorm", **kw)


def _grads(fn, *inputs: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """fn's output and the gradients of a fixed, non-uniform loss with respect to the inputs."""
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*inputs)
    weight = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
    (out * weight).sum().backward()
    return out.detach(), [t.grad for t in inputs]


def test_fused_rms_norm_matches_torch_rmsnorm() -> None:
    """One shape: each further one costs a compilation (the model test covers the q/k norms' [s, b, heads, d])."""
    from slime_like.trainer.megatron.fused_ops import FusedRMSNorm

    shape = (7, 2, 64)
    g = torch.Generator().manual_seed(0)
    x, weight = torch.randn(shape, generator=g), 1 + 0.1 * torch.randn(shape[-1], generator=g)
    fused = FusedRMSNorm(_config(), shape[-1], eps=1e-6)
    reference = torch.nn.RMSNorm(shape[-1], eps=1e-6)
    assert [n for n, _ in fused.named_parameters()] == [n for n, _ in reference.named_parameters()] == ["weight"]

    def run(module, x, w):
        module.weight = torch.nn.Parameter(w)
        return module(x)

    out, grads = _grads(lambda x, w: run(fused, x, w), x, weight)
    ref, ref_grads = _grads(lambda x, w: run(reference, x, w), x, weight)
    torch.testing.assert_close(out, ref, **TOL)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, **TOL)


def test_fused_rope_matches_megatron_unfused_bshd() -> None:
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd

    from slime_like.trainer.megatron.fused_ops import fused_apply_rotary_pos_emb

    g = torch.Generator().manual_seed(1)
    t = torch.randn(9, 2, 4, 16, generator=g)
    freqs = torch.randn(9, 1, 1, 12, generator=g) * 3  # partial rotary: 12 of 16 channels rotate
    out, (grad,) = _grads(lambda t: fused_apply_rotary_pos_emb(t, freqs), t)
    ref, (ref_grad,) = _grads(lambda t: _apply_rotary_pos_emb_bshd(t, freqs), t)
    torch.testing.assert_close(out, ref, **TOL)
    torch.testing.assert_close(grad, ref_grad, **TOL)
    assert torch.equal(out[..., 12:], t[..., 12:])


@pytest.mark.parametrize("per_token", [False, True], ids=["restarting", "per-token-freqs"])
def test_fused_rope_matches_megatron_unfused_thd(per_token: bool, megatron_world) -> None:
    from megatron.core import parallel_state as mpu
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_thd

    from slime_like.trainer.megatron.fused_ops import fused_apply_rotary_pos_emb_thd

    g = torch.Generator().manual_seed(2)
    cu_seqlens = torch.tensor([0, 5, 6, 13], dtype=torch.int32)
    t = torch.randn(13, 4, 16, generator=g)
    freqs = torch.randn(13 if per_token else 20, 1, 1, 16, generator=g)
    out, (grad,) = _grads(lambda t: fused_apply_rotary_pos_emb_thd(t, cu_seqlens, freqs), t)
    cp = mpu.get_context_parallel_group()
    ref, (ref_grad,) = _grads(lambda t: _apply_rotary_pos_emb_thd(t, cu_seqlens, freqs, cp_group=cp), t)
    torch.testing.assert_close(out, ref, **TOL)
    torch.testing.assert_close(grad, ref_grad, **TOL)


def test_megatron_swiglu_fusion_matches_the_unfused_glu() -> None:
    """The SwiGLU path turned on here is Megatron's bias_swiglu_impl, compiled by its jit_fuser (torch.compile)."""
    from megatron.core.fusions.fused_bias_swiglu import bias_swiglu_impl, weighted_bias_swiglu_impl
    from megatron.core.jit import jit_fuser

    assert jit_fuser is torch.compile
    g = torch.Generator().manual_seed(3)
    y, probs = torch.randn(11, 32, generator=g), torch.rand(11, 1, generator=g)

    def glu(y):
        gate, linear = torch.chunk(y, 2, dim=-1)
        return F.silu(gate) * linear

    for fused, reference in (
        (lambda y, p: bias_swiglu_impl(y, None), lambda y, p: glu(y)),
        (lambda y, p: weighted_bias_swiglu_impl(y, None, p), lambda y, p: glu(y) * p),
    ):
        out, grads = _grads(fused, y, probs)
        ref, ref_grads = _grads(reference, y, probs)
        torch.testing.assert_close(out, ref, **TOL)
        for got, want in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(got, want, **TOL)


def _model(hf_dir: Path, fused: bool):
    from slime_like.trainer.megatron.local_kernels_flags import LocalKernels
    from slime_like.trainer.megatron.model import build_model, load_hf_weights, make_bridge

    bridge = make_bridge(hf_dir, torch.float32, local_kernels=LocalKernels(fused_elementwise=fused))
    model = build_model(bridge, wrap_with_ddp=False)
    load_hf_weights(bridge, model, hf_dir)
    return bridge, model


def logits_and_grads(model: torch.nn.Module, vocab: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Logits of a fixed batch and the parameter gradients of a fixed function of its log-probs."""
    tokens = torch.randint(0, vocab, (2, 23), generator=torch.Generator().manual_seed(1))
    mask = ~torch.ones(23, 23, dtype=torch.bool).tril()[None, None].expand(2, 1, 23, 23)
    logits = model(tokens, torch.arange(23)[None].expand(2, 23), mask)
    (logits.float().log_softmax(-1) * torch.linspace(-1, 1, logits.shape[-1])).sum().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_fused_model_matches_reference_with_the_same_names(tiny_qwen3: Path, megatron_world) -> None:
    from slime_like.trainer.megatron.fused_ops import FusedRMSNorm
    from slime_like.trainer.megatron.model import export_hf_weights

    with torch._dynamo.config.patch(disable=True):  # the compiled kernels' eager bodies: see the module docstring
        ref_bridge, ref = _model(tiny_qwen3, fused=False)
        bridge, fused = _model(tiny_qwen3, fused=True)
        assert (bridge.config.apply_rope_fusion, bridge.config.bias_activation_fusion) == (True, True)
        assert not (ref_bridge.config.apply_rope_fusion or ref_bridge.config.bias_activation_fusion)
        norms = [m for m in fused[0].modules() if isinstance(m, FusedRMSNorm)]
        layers = ref_bridge.config.num_layers
        assert len(norms) == 4 * layers + 1  # input, pre-MLP, q and k norms per layer, and the final norm
        ref_logits, ref_grads = logits_and_grads(ref[0], ref_bridge.hf_config.vocab_size)
        logits, grads = logits_and_grads(fused[0], bridge.hf_config.vocab_size)
    torch.testing.assert_close(logits, ref_logits, atol=1e-6, rtol=0)
    assert list(grads) == list(ref_grads)  # parameter names unchanged
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], atol=1e-6 * ref_grads[name].abs().max().item(), rtol=0)
    ref_export = dict(export_hf_weights(ref_bridge, ref))
    export = dict(export_hf_weights(bridge, fused))
    assert list(export) == list(ref_export)
    assert all(torch.equal(export[n], ref_export[n]) for n in export)
