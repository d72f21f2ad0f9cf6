"""The local spec's fused elementwise kernels (Triton through torch.compile) and grouped-GEMM experts on CUDA against
the modules they replace: each kernel alone in bf16, then whole tiny models (log-probs and gradients; MoE ones in fp32,
where routing is stable): Qwen3, Qwen3-MoE and the hybrid Qwen3-Next / Qwen3.5 / Qwen3.5-MoE (zero-centred norms,
routed experts beside a gated shared expert; their gated delta nets need flash-linear-attention on CUDA, so they skip
without it)."""

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
    from slime_like.trainer.megatron.gated_delta_net import FusedZeroCenteredRMSNorm, ZeroCenteredRMSNorm
    from slime_like.trainer.megatron.grouped_experts import grouped_linear, grouped_mm_usable

    g = torch.Generator(device=CUDA).manual_seed(0)
    x = torch.randn(256, 2, 1024, device=CUDA, generator=g, dtype=torch.bfloat16)
    config = TransformerConfig(num_layers=1, hidden_size=1024, num_attention_heads=8, normalization="RMSNorm")
    fused = FusedRMSNorm(config, 1024, eps=1e-6).to(CUDA, torch.bfloat16)
    reference = torch.nn.RMSNorm(1024, eps=1e-6).to(CUDA, torch.bfloat16)
    _close(fused, reference, x)
    zero_centred, plain = (n(config, 1024, eps=1e-6).to(CUDA) for n in (FusedZeroCenteredRMSNorm, ZeroCenteredRMSNorm))
    with torch.no_grad():
        zero_centred.weight.copy_(0.1 * torch.randn(1024, device=CUDA, generator=g))
        plain.weight.copy_(zero_centred.weight)
    _close(zero_centred.to(torch.bfloat16), plain.to(torch.bfloat16), x)
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
    # The experts' grouped GEMM (CUTLASS for bf16 on SM90+) against one matmul per expert, an empty expert included.
    counts = [300, 0, 1000, 748]
    offsets = torch.cumsum(torch.tensor(counts, device=CUDA), 0, dtype=torch.int32)
    rows = torch.randn(sum(counts), 512, device=CUDA, generator=g, dtype=torch.bfloat16)
    weights = torch.randn(4, 1024, 512, device=CUDA, generator=g, dtype=torch.bfloat16) / 512**0.5
    assert grouped_mm_usable((512, 1024), torch.bfloat16)

    def per_expert(x, w):
        return torch.cat([part @ wi.T for part, wi in zip(torch.split(x, counts), w, strict=True)])

    _close(lambda x, w: grouped_linear(x, w, offsets, True), per_expert, rows, weights)


def _model(hf_dir: Path, fused: bool, grouped: bool, dtype: torch.dtype):
    from slime_like.trainer.megatron.local_kernels_flags import LocalKernels
    from slime_like.trainer.megatron.model import build_model, load_hf_weights, make_bridge

    kernels = LocalKernels(fused_elementwise=fused, grouped_experts=grouped)
    bridge = make_bridge(hf_dir, dtype, local_kernels=kernels)
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


HYBRID = ("qwen3_next", "qwen3_5", "qwen3_5_moe")


@pytest.fixture(scope="module")
def tiny_hybrid_dirs(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny Qwen3-Next, Qwen3.5 and Qwen3.5-MoE checkpoints (tests/megatron/tiny_families.py)."""
    from tests.megatron.tiny_families import make_qwen3_5, make_qwen3_next

    return {
        "qwen3_next": make_qwen3_next(tmp_path_factory.mktemp("next"), tiny_qwen3),
        "qwen3_5": make_qwen3_5(tmp_path_factory.mktemp("q35"), tiny_qwen3),
        "qwen3_5_moe": make_qwen3_5(tmp_path_factory.mktemp("q35moe"), tiny_qwen3, moe=True),
    }


# MoE models compare in fp32: in bf16 a last-bit difference flips some tokens' top-k experts (measured on the CPU: 10-40%
# of an expert's gradient), so their bf16 kernels are checked alone (test_kernels_match_references_in_bf16).
HALF, FULL = torch.bfloat16, torch.float32


@pytest.mark.parametrize(
    ("family", "fused", "grouped", "dtype"),
    [
        ("qwen3", True, False, HALF),
        ("qwen3_moe", False, True, FULL),
        ("qwen3_moe", True, True, FULL),
        ("qwen3_next", True, True, FULL),
        ("qwen3_5", True, False, HALF),
        ("qwen3_5_moe", True, True, FULL),
    ],
    ids=["dense-fused-bf16", "moe-grouped", "moe-fused-grouped", "qwen3_next", "qwen3_5-bf16", "qwen3_5_moe"],
)
def test_fast_paths_match_reference_model(
    family: str, fused: bool, grouped: bool, dtype: torch.dtype, request: pytest.FixtureRequest, world
) -> None:
    from megatron.core.transformer.moe.experts import SequentialMLP

    from slime_like.trainer.megatron.fused_ops import FusedRMSNorm
    from slime_like.trainer.megatron.gated_delta_net import FusedZeroCenteredRMSNorm
    from slime_like.trainer.megatron.grouped_experts import GroupedExperts

    if family in HYBRID:  # their gated delta nets run fla's kernels on CUDA
        pytest.importorskip("fla", reason="flash-linear-attention is not installed")
        hf_dir = request.getfixturevalue("tiny_hybrid_dirs")[family]
    else:
        hf_dir = request.getfixturevalue(f"tiny_{family}")
    ref_bridge, ref = _model(hf_dir, False, False, dtype)
    bridge, fast = _model(hf_dir, fused, grouped, dtype)
    assert bool(bridge.config.apply_rope_fusion) == fused and not ref_bridge.config.apply_rope_fusion
    fused_norms = [m for m in fast.modules() if isinstance(m, FusedRMSNorm | FusedZeroCenteredRMSNorm)]
    assert bool(fused_norms) == fused
    experts = [m for m in fast.modules() if isinstance(m, SequentialMLP)]
    assert all(isinstance(m, GroupedExperts) == grouped for m in experts)
    ref_lp, ref_grads = _logprobs_and_grads(ref, ref_bridge.hf_config.vocab_size)
    lp, grads = _logprobs_and_grads(fast, bridge.hf_config.vocab_size)
    # fp32 is not exact either: fla's kernels take fp32 dots in TF32 (2e-5 on logits, docs/performance.md).
    torch.testing.assert_close(lp, ref_lp, atol=5e-2 if dtype == HALF else 1e-3, rtol=0)
    assert list(grads) == list(ref_grads)
    for name, grad in grads.items():
        # The gated delta net's per-head decay gradients are sums that nearly cancel (1e-4 relative from last-bit
        # changes in fp32 on the CPU, tests/megatron/test_fused_ops.py): a wider margin for them.
        decay = name.endswith(("self_attention.A_log", "self_attention.dt_bias"))
        tolerance = 0.25 if decay else (5e-2 if dtype == HALF else 1e-2)
        torch.testing.assert_close(grad, ref_grads[name], atol=tolerance * ref_grads[name].abs().max().item(), rtol=0)


def test_gated_delta_net_packed_row_matches_per_sequence(tiny_hybrid_dirs, world) -> None:
    """A THD row of three sequences through one gated delta net layer at once (fla's kernel given cu_seqlens, the conv
    cut at each start) against megatron-core's forward run per sequence: outputs and parameter gradients."""
    pytest.importorskip("fla", reason="flash-linear-attention is not installed")
    from megatron.core.packed_seq_params import PackedSeqParams

    from slime_like.trainer.megatron.gated_delta_net import PackedGatedDeltaNet

    _, model = _model(tiny_hybrid_dirs["qwen3_next"], False, False, torch.float32)
    gdn = next(m for m in model.modules() if isinstance(m, PackedGatedDeltaNet))
    g = torch.Generator(device=CUDA).manual_seed(3)
    bounds = [0, 70, 71, 200]
    hidden = torch.randn(200, 1, model.config.hidden_size, device=CUDA, generator=g)
    weights = torch.randn(hidden.shape, device=CUDA, generator=g)
    thd = PackedSeqParams(qkv_format="thd", cu_seqlens_q=torch.tensor(bounds, device=CUDA, dtype=torch.int32))

    def run(forward) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        gdn.zero_grad()
        out = forward()
        (out * weights).sum().backward()
        return out.detach(), {n: p.grad.clone() for n, p in gdn.named_parameters()}

    pieces = zip(bounds[:-1], bounds[1:], strict=True)
    separate, separate_grads = run(lambda: torch.cat([gdn(hidden[a:b], None)[0] for a, b in pieces]))
    packed, grads = run(lambda: gdn(hidden, None, packed_seq_params=thd)[0])
    # fla takes fp32 dots in TF32 (docs/performance.md): 1e-3 of the largest value; the per-head decay gradients are
    # sums that nearly cancel (test_fast_paths_match_reference_model), so 5e-2 for them.
    torch.testing.assert_close(packed, separate, atol=1e-3 * separate.abs().max().item(), rtol=0)
    for name, grad in grads.items():
        want = separate_grads[name]
        tolerance = 5e-2 if name.endswith(("A_log", "dt_bias")) else 1e-3
        torch.testing.assert_close(grad, want, atol=tolerance * want.abs().max().item(), rtol=0)
