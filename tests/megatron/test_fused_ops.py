"""The fused elementwise paths of the local spec (fused_ops.py) against the modules and math they replace.

Kernel tests run the torch.compile'd functions (inductor compiles C++ on this CPU); the model test checks the wiring
(modules swapped, Megatron's fusion switches on, names unchanged) with dynamo disabled, i.e. the same functions'
eager bodies, so the suite does not compile a whole model."""

from __future__ import annotations

from collections import Counter
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


@pytest.mark.parametrize("zero_centred", [False, True], ids=["rmsnorm", "zero-centred"])
def test_fused_rms_norm_matches_torch_rmsnorm(zero_centred: bool) -> None:
    """One shape: each further one costs a compilation (the model test covers the q/k norms' [s, b, heads, d]). The
    zero-centred norm (Qwen3-Next/3.5) runs the same compiled kernel with 1 + weight, against transformers' norm."""
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNorm

    from slime_like.trainer.megatron.fused_ops import FusedRMSNorm
    from slime_like.trainer.megatron.gated_delta_net import FusedZeroCenteredRMSNorm

    shape = (7, 2, 64)
    g = torch.Generator().manual_seed(0)
    x, weight = torch.randn(shape, generator=g), 1 + 0.1 * torch.randn(shape[-1], generator=g)
    if zero_centred:
        weight = weight - 1  # a zero-centred weight scales by 1 + weight
        fused = FusedZeroCenteredRMSNorm(_config(), shape[-1], eps=1e-6)
        reference = Qwen3NextRMSNorm(shape[-1], eps=1e-6)
    else:
        fused = FusedRMSNorm(_config(), shape[-1], eps=1e-6)
        reference = torch.nn.RMSNorm(shape[-1], eps=1e-6)
    assert [n for n, _ in fused.named_parameters()] == [n for n, _ in reference.named_parameters()] == ["weight"]

    def run(module, x, w):  # w as the module's weight, so that its gradient reaches w
        return torch.func.functional_call(module, {"weight": w}, (x,))

    out, grads = _grads(lambda x, w: run(fused, x, w), x, weight)
    ref, ref_grads = _grads(lambda x, w: run(reference, x, w), x, weight)
    torch.testing.assert_close(out, ref, **TOL)
    assert all(grad is not None for grad in grads + ref_grads)  # the weight's gradient too
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


def checkpoint_of(family: str, request: pytest.FixtureRequest) -> Path:
    """The tiny checkpoint of a family: the session's Qwen3 / Qwen3-MoE fixtures, or a hybrid one (conftest.py)."""
    if family in ("qwen3", "qwen3_moe"):
        return request.getfixturevalue(f"tiny_{family}")
    return request.getfixturevalue("tiny_hybrid")(family)


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


def _norm_counts(model: torch.nn.Module) -> Counter:
    """How many norms of each class the model holds, by class name."""
    from slime_like.trainer.megatron.fused_ops import FusedRMSNorm
    from slime_like.trainer.megatron.gated_delta_net import RMSNorm as HybridRMSNorm

    norms = (torch.nn.RMSNorm, FusedRMSNorm, HybridRMSNorm)
    return Counter(type(m).__name__ for m in model.modules() if isinstance(m, norms))


# (fused norms, unfused norms left, RoPE fused) per family. Qwen3: input, pre-MLP, q and k norms per layer (2 layers)
# and the final norm. Qwen3-Next / Qwen3.5 (4 layers, gated attention in layers 2 and 4): the same, zero-centred, and
# the two gated delta nets' out_norms, which stay RMSNorm (Megatron compiles them with their gate: gated_delta_net.py).
# Qwen3.5's checkpoints are vision-language ones: multimodal RoPE, fused as well (with two rows, as here, Megatron runs
# it unfused; tests/megatron/test_vlm_parity.py::test_fused_mrope_matches_transformers runs the kernel).
FUSED = {
    "qwen3": ({"FusedRMSNorm": 9}, {}, True),
    "qwen3_next": ({"FusedZeroCenteredRMSNorm": 13}, {"RMSNorm": 2}, True),
    "qwen3_5_moe": ({"FusedZeroCenteredRMSNorm": 13}, {"RMSNorm": 2}, True),
}


@pytest.mark.parametrize("family", list(FUSED))
def test_fused_model_matches_reference_with_the_same_names(
    family: str, request: pytest.FixtureRequest, megatron_world
) -> None:
    from slime_like.trainer.megatron.model import export_hf_weights

    hf_dir = checkpoint_of(family, request)
    with torch._dynamo.config.patch(disable=True):  # the compiled kernels' eager bodies: see the module docstring
        ref_bridge, ref = _model(hf_dir, fused=False)
        bridge, fused = _model(hf_dir, fused=True)
        fused_norms, kept, rope = FUSED[family]
        assert (bridge.config.apply_rope_fusion, bridge.config.bias_activation_fusion) == (rope, True)
        assert not (ref_bridge.config.apply_rope_fusion or ref_bridge.config.bias_activation_fusion)
        assert _norm_counts(fused[0]) == Counter({**fused_norms, **kept})
        assert not any(name.startswith("Fused") for name in _norm_counts(ref[0]))
        ref_logits, ref_grads = logits_and_grads(ref[0], ref_bridge.hf_config.vocab_size)
        logits, grads = logits_and_grads(fused[0], bridge.hf_config.vocab_size)
    torch.testing.assert_close(logits, ref_logits, atol=1e-6, rtol=0)
    assert list(grads) == list(ref_grads)  # parameter names unchanged
    for name, grad in grads.items():
        scale = ref_grads[name].abs().max().item()
        torch.testing.assert_close(grad, ref_grads[name], atol=gradient_tolerance(name) * scale, rtol=0)
    ref_export = dict(export_hf_weights(ref_bridge, ref))
    export = dict(export_hf_weights(bridge, fused))
    assert list(export) == list(ref_export)
    assert all(torch.equal(export[n], ref_export[n]) for n in export)


def gradient_tolerance(name: str) -> float:
    """A parameter's gradient tolerance, relative to its largest gradient."""
    # fp32 rounding (1e-6), except the gated delta net's per-head decay (A_log, dt_bias): their gradients are sums
    # over every token and channel that nearly cancel (5e-4 where others reach 0.5), so a last-bit change anywhere
    # shows up 1e-4 relative. Measured: 1.5e-4 with Megatron's fused SwiGLU alone (its own backward formula) and the
    # norms unfused; the fused norms alone are bit-exact.
    return 5e-4 if name.endswith(("self_attention.A_log", "self_attention.dt_bias")) else 1e-6
