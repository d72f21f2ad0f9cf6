"""GroupedExperts (grouped_experts.py) against per-expert matmuls and against Megatron's SequentialMLP: the same
log-probs and gradients on tiny Qwen3-MoE, Qwen3-Next and Qwen3.5-MoE (routed experts beside a gated shared expert),
the same parameter and export names."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.megatron.test_fused_ops import checkpoint_of, gradient_tolerance, logits_and_grads


def _per_expert(x: torch.Tensor, weights: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """The reference: each expert's rows times its weight, one expert after another."""
    return torch.cat([rows @ w.T for rows, w in zip(torch.split(x, counts), weights, strict=True)])


@pytest.mark.parametrize(
    ("use_grouped_mm", "dtype"),
    [(True, torch.float32), (False, torch.float32), (True, torch.bfloat16)],
    ids=["grouped_mm-fp32", "padded-bmm-fp32", "grouped_mm-bf16"],
)
def test_grouped_linear_matches_per_expert_matmuls(use_grouped_mm: bool, dtype: torch.dtype) -> None:
    from slime_like.trainer.megatron.grouped_experts import grouped_linear, grouped_mm_usable

    if use_grouped_mm and not grouped_mm_usable((16, 32), dtype):
        pytest.skip(f"torch._grouped_mm does not take {dtype} here")
    counts = [3, 0, 7, 2]  # an expert without tokens too
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(sum(counts), 16, generator=g).to(dtype), torch.randn(4, 32, 16, generator=g).to(dtype)
    offsets = torch.cumsum(torch.tensor(counts), 0, dtype=torch.int32)
    grad_out = torch.randn(sum(counts), 32, generator=g).to(dtype)
    results = []
    for fn in (lambda x, w: grouped_linear(x, w, offsets, use_grouped_mm), lambda x, w: _per_expert(x, w, counts)):
        xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
        out = fn(xi, wi)
        out.backward(grad_out)
        results.append((out.detach(), xi.grad, wi.grad))
    tol = {"atol": 1e-6, "rtol": 1e-6} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got.float(), want.float(), **tol)


def _model(hf_dir: Path, grouped: bool):
    from slime_like.trainer.megatron.local_kernels_flags import LocalKernels
    from slime_like.trainer.megatron.model import build_model, load_hf_weights, make_bridge

    bridge = make_bridge(hf_dir, torch.float32, local_kernels=LocalKernels(grouped_experts=grouped))
    model = build_model(bridge, wrap_with_ddp=False)
    load_hf_weights(bridge, model, hf_dir)
    return bridge, model


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen3_next", "qwen3_5_moe"])
def test_grouped_experts_match_sequential_mlp(family: str, request: pytest.FixtureRequest, megatron_world) -> None:
    from megatron.core.transformer.moe.experts import SequentialMLP
    from megatron.core.transformer.moe.shared_experts import SharedExpertMLP

    from slime_like.trainer.megatron.grouped_experts import GroupedExperts
    from slime_like.trainer.megatron.model import export_hf_weights

    hf_dir = checkpoint_of(family, request)
    ref_bridge, ref = _model(hf_dir, grouped=False)
    bridge, grouped = _model(hf_dir, grouped=True)
    experts = [m for m in grouped[0].modules() if isinstance(m, SequentialMLP)]
    assert len(experts) == ref_bridge.config.num_layers  # every layer is MoE
    assert all(type(m) is GroupedExperts and m.grouped for m in experts)
    shared = [m for m in grouped[0].modules() if isinstance(m, SharedExpertMLP)]
    assert len(shared) == (0 if family == "qwen3_moe" else 4) and all(m.use_shared_expert_gate for m in shared)
    assert not any(isinstance(m, GroupedExperts) for m in ref[0].modules())
    # Megatron compiles the hybrid families' gated norm and attention gate (jit_fuser); their eager bodies here, as
    # compiling them on the CPU costs ~9 s and the experts under test compile nothing.
    with torch._dynamo.config.patch(disable=True):
        ref_logits, ref_grads = logits_and_grads(ref[0], ref_bridge.hf_config.vocab_size)
        logits, grads = logits_and_grads(grouped[0], bridge.hf_config.vocab_size)
    ref_logprobs, logprobs = ref_logits.log_softmax(-1), logits.log_softmax(-1)
    torch.testing.assert_close(logprobs, ref_logprobs, atol=1e-5, rtol=0)
    assert list(grads) == list(ref_grads)  # SequentialMLP's parameter names: local_experts.{i}.linear_fc1.weight
    assert any(".local_experts." in name for name in grads)
    for name, grad in grads.items():
        tolerance = max(1e-5, gradient_tolerance(name)) * ref_grads[name].abs().max().item()
        torch.testing.assert_close(grad, ref_grads[name], atol=tolerance, rtol=0)
    ref_export = dict(export_hf_weights(ref_bridge, ref))
    export = dict(export_hf_weights(bridge, grouped))
    assert list(export) == list(ref_export) and any(".experts.3." in n for n in export)
    assert all(torch.equal(export[n], ref_export[n]) for n in export)


def test_grouped_experts_checkpoint_converts_to_hf(tiny_qwen3_moe: Path, megatron_world, tmp_path: Path) -> None:
    """A torch_dist checkpoint saved with grouped experts converts back to the checkpoint's HF tensors."""
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.local_kernels_flags import LocalKernels
    from tests.megatron.common import torch_dist_to_hf_round_trip
    from tests.megatron.test_families import safetensors_of

    engine = MegatronTrainEngine(tiny_qwen3_moe, local_kernels=LocalKernels(grouped_experts=True))
    converted = torch_dist_to_hf_round_trip(engine, tiny_qwen3_moe, tmp_path)
    stored = safetensors_of(tiny_qwen3_moe)
    assert sorted(converted) == sorted(stored)
    assert all(torch.equal(converted[n], stored[n].to(converted[n].dtype)) for n in stored)
