"""MoE experts as grouped GEMMs from torch, keeping SequentialMLP's parameters (no Transformer Engine, no grouped_gemm).

SequentialMLP, the local spec's experts, runs one expert after another in a Python loop: per expert a split, two
small matmuls and the activation, then a concatenation. Megatron's GroupedMLP needs the grouped_gemm package, and its
TEGroupedMLP needs TE. GroupedExperts subclasses SequentialMLP, so its parameters, checkpoints (sharded_state_dict),
HF name maps and weight updates stay `local_experts.{i}.linear_fc1.weight` / `linear_fc2.weight`; only the forward
changes: the token dispatcher hands over tokens already sorted by local expert with their counts, so the group
offsets are a cumsum, and each projection is one `torch._grouped_mm` over all experts: torch's CUTLASS kernel for
bf16 on SM90+ GPUs; elsewhere (other dtypes or GPUs, and the CPU in torch 2.13, fp32/bf16/fp16) torch's own per-group
fallback inside the op. It needs rows of a multiple of 16 bytes; otherwise a padded batched matmul (tokens scattered
into [experts, max tokens, hidden] by their rank within their expert) replaces it, with no per-expert loop.

The expert weights are stacked each forward (one copy of the local experts' weights, kept for the backward) and the
stack's backward hands each expert its own gradient, so Megatron's DDP gradient hooks see the same parameters.
Expert linears do no tensor-parallel communication of their own (the dispatcher does it for EP and expert-TP), so the
same math serves every EP and expert-TP size. Configs this does not cover (expert biases, FP8/FP4, a latent MoE size,
clamped or offset GLUs) run SequentialMLP's loop unchanged. A shared expert (Qwen3-Next/3.5's gated one, DeepSeek-V3's)
is one dense MLP over every token, beside the routed experts: there is no loop to group, and joining it to the routed
GEMM would take a copy of every token through the dispatcher and a width equal to the routed experts'.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.transformer.moe.experts import SequentialMLP

GROUPED_MM = hasattr(torch, "_grouped_mm")


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the gradient contiguous (grouped_mm's backward refuses expanded gradients)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def grouped_mm_usable(dims: tuple[int, ...], dtype: torch.dtype) -> bool:
    """Whether torch._grouped_mm takes matrices with these row widths in this dtype (rows of 16-byte multiples)."""
    supported = GROUPED_MM and dtype in (torch.float32, torch.bfloat16, torch.float16)
    return supported and all(d * dtype.itemsize % 16 == 0 for d in dims)


def grouped_linear(x: torch.Tensor, weights: torch.Tensor, offsets: torch.Tensor, use_grouped_mm: bool) -> torch.Tensor:
    """Rows of x (sorted by group; group g ends at offsets[g]) times weights[g].T: [tokens, in] -> [tokens, out]."""
    if use_grouped_mm:
        return torch._grouped_mm(x.contiguous(), weights.transpose(1, 2), offs=offsets)
    return _padded_bmm(x, weights, offsets)


def _padded_bmm(x: torch.Tensor, weights: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """grouped_linear as one bmm over [groups, longest group, in], tokens placed by their rank within their group."""
    counts = torch.diff(offsets.long(), prepend=offsets.new_zeros(1).long())
    group = torch.repeat_interleave(torch.arange(len(counts), device=x.device), counts, output_size=x.shape[0])
    rank = torch.arange(x.shape[0], device=x.device) - (offsets.long() - counts)[group]
    longest = int(counts.max()) if len(counts) else 0
    padded = x.new_zeros(len(counts), longest, x.shape[-1]).index_put((group, rank), x)
    return torch.bmm(padded, weights.transpose(1, 2))[group, rank]


def grouped_supported(config: Any) -> bool:
    """Whether GroupedExperts' grouped path covers this config (otherwise SequentialMLP's loop runs)."""
    return not (
        config.add_bias_linear
        or config.fp8
        or getattr(config, "fp4", None)
        or getattr(config, "moe_latent_size", None) is not None
        or getattr(config, "activation_func_clamp_value", None) is not None
        or getattr(config, "glu_linear_offset", 0.0)
        or getattr(config, "use_te_activation_func", False)
    )


class GroupedExperts(SequentialMLP):
    """SequentialMLP's local experts and parameters, run as two grouped GEMMs over all experts."""

    def __init__(self, num_local_experts: int, config: Any, submodules: Any, pg_collection: Any = None) -> None:
        super().__init__(num_local_experts, config, submodules, pg_collection)
        self.grouped = grouped_supported(self.config)

    def forward(
        self, permuted_local_hidden_states: torch.Tensor, tokens_per_expert: torch.Tensor, permuted_probs: torch.Tensor
    ) -> tuple[torch.Tensor, None]:
        """Experts' outputs for tokens sorted by local expert (tokens_per_expert of each), weighted by their probs."""
        if not self.grouped:
            return super().forward(permuted_local_hidden_states, tokens_per_expert, permuted_probs)
        x, probs = permuted_local_hidden_states, permuted_probs
        if self.config.moe_apply_probs_on_input:  # as SequentialMLP: scale the input, then weight 1
            x = (probs.unsqueeze(-1) * x).to(x.dtype)
            probs = torch.ones_like(probs)
        counts = torch.as_tensor(tokens_per_expert, device=x.device)
        offsets = torch.cumsum(counts, 0, dtype=torch.int32)
        w1 = torch.stack([e.linear_fc1.weight for e in self.local_experts])  # [E, (2)ffn, hidden]
        w2 = torch.stack([e.linear_fc2.weight for e in self.local_experts])  # [E, hidden, ffn]
        use_mm = grouped_mm_usable((x.shape[-1], w1.shape[1], w2.shape[1], w2.shape[2]), x.dtype)
        h = grouped_linear(x, w1, offsets, use_mm)
        a = self._activation(h, probs)
        out = grouped_linear(a, w2, offsets, use_mm)
        return _ContiguousGrad.apply(out), None

    def _activation(self, h: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """MLP.forward's activation and per-token weighting, fused or not as the config says."""
        config = self.config
        if config.bias_activation_fusion and config.gated_linear_unit and config.activation_func is F.silu:
            from megatron.core.fusions.fused_bias_swiglu import weighted_bias_swiglu_impl

            return weighted_bias_swiglu_impl(h, None, probs.unsqueeze(-1), config.activation_func_fp8_input_store)
        if config.gated_linear_unit:
            gate, linear = torch.chunk(h, 2, dim=-1)
            a = config.activation_func(gate) * linear
        else:
            a = config.activation_func(h)
        return (a * probs.unsqueeze(-1)).to(a.dtype)


def use_grouped_experts(spec: Any) -> Any:
    """Swap SequentialMLP for GroupedExperts in every MoE layer of a block spec (same submodules and parameters)."""
    for layer in spec.layer_specs:
        experts = getattr(getattr(layer.submodules.mlp, "submodules", None), "experts", None)
        if experts is not None and getattr(experts, "module", None) is SequentialMLP:
            experts.module = GroupedExperts
    return spec
