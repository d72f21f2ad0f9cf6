"""Qwen3-Next's hybrid decoder on megatron-core 0.16: gated delta net (linear attention) layers between gated
full-attention layers, with zero-centered RMSNorms.

- Kernels: megatron-core's GatedDeltaNet calls flash-linear-attention (fla: `chunk_gated_delta_rule`, `l2norm`,
  Triton). On GPU they must be installed (`pip install flash-linear-attention`; `require_kernels` says so at start).
  Without CUDA, `require_kernels` hands the module transformers' pure-torch versions of the same two functions
  (the ones transformers' Qwen3-Next falls back to), so the layer runs on CPU; its causal conv1d already falls
  back to torch's Conv1d when `causal_conv1d` is absent.
- Sequences: GatedDeltaNet ignores the attention mask and refuses packed (THD) sequences; `PackedGatedDeltaNet`
  runs a packed row (block-diagonal mask or `cu_seqlens`) at once, its causal conv and delta-rule state cut at each
  sequence's start: fla's kernel takes the row's cu_seqlens in one call; the CPU's torch kernel runs per sequence.
- Norms: Qwen3-Next's RMSNorms scale by (1 + weight) (Megatron's `layernorm_zero_centered_gamma`), which
  Megatron's torch norm refuses: the local (CPU) spec gets `ZeroCenteredRMSNorm`. The norm inside the linear
  attention (HF `linear_attn.norm`) scales by its weight alone: `RMSNorm` on every backend, so HF weights load
  unchanged (bit-exact both ways). With --local-fused-elementwise the zero-centred ones run fused_ops' compiled
  RMSNorm (`FusedZeroCenteredRMSNorm`), and with --local-grouped-experts the routed experts are grouped GEMMs.
- Layer spec: megatron's own hybrid block spec with Transformer Engine; the same layout from the local spec
  without it (megatron's builder asserts Transformer Engine).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch
from megatron.core.ssm import gated_delta_net as _gdn
from megatron.core.ssm.gated_delta_net import GatedDeltaNet, GatedDeltaNetSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec

FLA_INSTALL = "pip install flash-linear-attention"


def require_kernels() -> None:
    """Give GatedDeltaNet its gated-delta-rule kernels: fla on GPU (an ImportError naming the package when it is
    missing), transformers' torch implementation on CPU."""
    from slime_like.trainer.megatron.cpu_compat import ON_CUDA

    if ON_CUDA:
        if not _gdn.HAVE_FLA:
            raise ImportError(
                "Qwen3-Next / Qwen3.5's gated delta net layers need flash-linear-attention (fla) on GPU: "
                f"`{FLA_INSTALL}`"
            )
        return
    from transformers.models.qwen3_next.modeling_qwen3_next import l2norm, torch_chunk_gated_delta_rule

    _gdn.chunk_gated_delta_rule = torch_chunk_gated_delta_rule
    _gdn.l2norm = l2norm
    _gdn.HAVE_FLA = True  # GatedDeltaNet.__init__ refuses to build otherwise


class RMSNorm(torch.nn.Module):
    """RMSNorm computed in fp32, scaled by `weight` (or by 1 + `weight` when zero-centered), as transformers' Qwen3-Next."""

    zero_centered = False

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-6, **_: Any) -> None:
        super().__init__()
        self.eps = eps
        self.tp_group: Any = None  # set where each TP rank normalises only its own heads (PackedGatedDeltaNet)
        self.weight = torch.nn.Parameter(
            torch.full((hidden_size,), 0.0 if self.zero_centered else 1.0, dtype=config.params_dtype)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The normalised x, in x's dtype."""
        weight = self.weight
        if self.tp_group is not None and self.tp_group.size() > 1:
            from megatron.core.tensor_parallel import copy_to_tensor_model_parallel_region

            # Each rank's gradient covers its heads only: summed over TP in backward, as every rank holds the weight.
            weight = copy_to_tensor_model_parallel_region(weight, group=self.tp_group)
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.zero_centered:
            return (y * (1.0 + weight.float())).type_as(x)
        # transformers' gated norm casts back before scaling: the same rounding in bf16.
        return weight * y.to(x.dtype)


class ZeroCenteredRMSNorm(RMSNorm):
    """RMSNorm scaled by 1 + weight (Megatron's layernorm_zero_centered_gamma; HF's Qwen3NextRMSNorm)."""

    zero_centered = True


class FusedZeroCenteredRMSNorm(ZeroCenteredRMSNorm):
    """ZeroCenteredRMSNorm as fused_ops' compiled RMSNorm kernel (--local-fused-elementwise), the same parameter."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The normalised x, in x's dtype."""
        if self.tp_group is not None:  # only the gated out_norm has one, and it stays unswapped (see hybrid_block_spec)
            return super().forward(x)
        from slime_like.trainer.megatron.fused_ops import fused_rms_norm

        # 1 + weight in fp32 outside the kernel: the same math and rounding as the parent's, and the compiled kernel
        # is the one FusedRMSNorm uses (no second compilation); the [hidden] add is negligible.
        return fused_rms_norm(x, 1.0 + self.weight.float(), self.eps)


def _segments(attention_mask: torch.Tensor | None, packed_seq_params: Any, length: int, row: int) -> list[tuple]:
    """The (start, end) of each sequence of a token row: from THD's cu_seqlens, or where a token cannot see the one
    before it in a block-diagonal causal mask (True = masked); one segment for a plain causal row."""
    if packed_seq_params is not None:
        bounds = packed_seq_params.cu_seqlens_q_padded
        if bounds is None:
            bounds = packed_seq_params.cu_seqlens_q
        bounds = [int(b) for b in bounds.tolist() if 0 <= int(b) <= length]
    elif attention_mask is not None and attention_mask.dim() == 4 and length > 1:
        mask = attention_mask[row if attention_mask.shape[0] > 1 else 0, 0]
        idx = torch.arange(1, length, device=mask.device)
        starts = (idx[mask[idx, idx - 1]]).tolist()
        bounds = [0, *starts, length]
    else:
        bounds = [0, length]
    bounds = sorted(set(bounds) | {0, length})
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


class PackedGatedDeltaNet(GatedDeltaNet):
    """megatron-core's GatedDeltaNet run once per sequence of a packed row (its recurrence must not cross them)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Split over TP along dim 0 (GatedDeltaNet.sharded_state_dict), but partition_dim is left unset, which
        # Megatron later defaults to -1: the conversion (hf_weights) reads it to shard and gather these.
        for param in (self.conv1d.weight, self.conv1d.bias, self.A_log, self.dt_bias):
            if param is not None:
                param.partition_dim = 0
        # The gated output norm is replicated but sees only this rank's value heads (megatron-core leaves its gradient
        # partial without sequence parallel): its gradient is summed over TP (RMSNorm.forward).
        if isinstance(self.out_norm, RMSNorm):
            self.out_norm.tp_group = self.pg_collection.tp

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None, *args: Any, **kwargs: Any):
        """GatedDeltaNet's output for [s, b, h] hidden states holding one or more whole sequences per row."""
        packed = kwargs.pop("packed_seq_params", None)
        length, batch = hidden_states.shape[:2]
        rows = [_segments(attention_mask, packed, length, b) for b in range(batch)]
        if all(len(r) == 1 for r in rows):
            return super().forward(hidden_states, None, *args, **kwargs)
        if self.config.sequence_parallel:
            raise ValueError(
                "gated delta net layers with packed sequences run without --sequence-parallel (each rank holds part of "
                "the sequence); turn it off or use one sequence per micro-batch row"
            )
        parts = [self._packed_row(hidden_states[:, b : b + 1], segments) for b, segments in enumerate(rows)]
        return torch.cat([out for out, _ in parts], dim=1), parts[0][1]

    def _packed_row(self, hidden_states: torch.Tensor, segments: list[tuple]) -> tuple[torch.Tensor, Any]:
        """GatedDeltaNet.forward's steps for one [s, 1, h] row of whole sequences at once: the projections, gates and
        norms per token as there, the causal conv and the delta rule kept inside each sequence (_segment_conv,
        _varlen_delta_rule); the same output as running the module once per sequence."""
        length = hidden_states.shape[0]
        qkvzba, _ = self.in_proj(hidden_states)
        qkv, gate, beta, alpha = torch.split(
            qkvzba.transpose(0, 1),
            [
                (self.qk_dim * 2 + self.v_dim) // self.tp_size,
                self.v_dim // self.tp_size,
                self.num_value_heads // self.tp_size,
                self.num_value_heads // self.tp_size,
            ],
            dim=-1,
        )
        gate = gate.reshape(1, length, -1, self.value_head_dim)
        bounds = torch.tensor([0, *(end for _, end in segments)], device=hidden_states.device)
        qkv = self.act_fn(_segment_conv(self.conv1d, qkv.transpose(1, 2), bounds)).transpose(1, 2)
        query, key, value = torch.split(
            qkv, [self.qk_dim // self.tp_size, self.qk_dim // self.tp_size, self.v_dim // self.tp_size], dim=-1
        )
        query = query.reshape(1, length, -1, self.key_head_dim)
        key = key.reshape(1, length, -1, self.key_head_dim)
        value = value.reshape(1, length, -1, self.value_head_dim).contiguous()
        if self.use_qk_l2norm:
            query, key = _gdn.l2norm(query.contiguous()), _gdn.l2norm(key.contiguous())
        if self.num_value_heads // self.num_key_heads > 1:
            query = query.repeat_interleave(self.num_value_heads // self.num_key_heads, dim=2)
            key = key.repeat_interleave(self.num_value_heads // self.num_key_heads, dim=2)
        g = -self.A_log.exp() * torch.nn.functional.softplus(alpha.reshape(1, length, -1).float() + self.dt_bias)
        kernel = _gdn.torch_chunk_gated_delta_rule if self.config.deterministic_mode else _gdn.chunk_gated_delta_rule
        core = _varlen_delta_rule(kernel, query.contiguous(), key.contiguous(), value, g, beta.sigmoid(), bounds)
        norm_out = self._apply_gated_norm(core, gate.contiguous()).reshape(1, length, -1)
        return self.out_proj(norm_out.transpose(0, 1).contiguous())


def _segment_conv(conv: torch.nn.Conv1d, x: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """GatedDeltaNet's causal conv (`conv` pads width - 1 on both sides; the first outputs are causal) of x
    [1, channels, s] with no window crossing a sequence start: width - 1 zeros go before every sequence, as before a
    sequence run alone, and each token's output is read back from its shifted place. bounds: [0, each sequence's end].
    """
    pad, length = conv.kernel_size[0] - 1, x.shape[-1]
    lengths = bounds[1:] - bounds[:-1]
    sequence = torch.repeat_interleave(torch.arange(len(lengths), device=x.device), lengths, output_size=length)
    shifted = torch.arange(length, device=x.device) + pad * (sequence + 1)
    spread = x.new_zeros(*x.shape[:-1], length + pad * len(lengths)).index_copy(-1, shifted, x)
    return conv(spread)[..., : spread.shape[-1]].index_select(-1, shifted)


def _varlen_delta_rule(
    kernel: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    bounds: torch.Tensor,
) -> torch.Tensor:
    """The chunked gated delta rule over packed [1, s, ...] inputs, its state restarting at every bound: one call with
    cu_seqlens on fla's kernel, one call per sequence on the torch fallbacks (they take no cu_seqlens)."""
    common = {"initial_state": None, "output_final_state": False, "use_qk_l2norm_in_kernel": False}
    if getattr(kernel, "__module__", "").startswith("fla."):
        return kernel(query, key, value, g=g, beta=beta, cu_seqlens=bounds.long(), **common)[0]
    cuts = [int(b) for b in bounds.tolist()]
    outs = [
        kernel(query[:, a:b], key[:, a:b], value[:, a:b], g=g[:, a:b], beta=beta[:, a:b], **common)[0]
        for a, b in zip(cuts[:-1], cuts[1:], strict=True)
    ]
    return torch.cat(outs, dim=1)


def _linear_attention_spec(local: bool) -> ModuleSpec:
    """The GDN attention module: a separate input norm on the local spec, fused into in_proj with TE."""
    if local:
        from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

        in_proj, out_proj = ColumnParallelLinear, RowParallelLinear
    else:
        from megatron.core.extensions.transformer_engine import TELayerNormColumnParallelLinear, TERowParallelLinear

        in_proj, out_proj = TELayerNormColumnParallelLinear, TERowParallelLinear
    return ModuleSpec(
        module=PackedGatedDeltaNet,
        submodules=GatedDeltaNetSubmodules(in_proj=in_proj, out_norm=RMSNorm, out_proj=out_proj),
        metainfo={"fuse_input_layernorm": not local},
    )


def _replace_norms(spec: Any, norm: type, old: tuple[type, ...]) -> Any:
    """A copy of a spec tree (ModuleSpec / submodule dataclasses) with every norm class in `old` replaced."""
    if isinstance(spec, type) and spec in old:
        return norm
    if isinstance(spec, ModuleSpec):
        spec = copy.copy(spec)
        if spec.module in old:
            spec.module = norm
        spec.submodules = _replace_norms(spec.submodules, norm, old)
        return spec
    if dataclasses.is_dataclass(spec) and not isinstance(spec, type):
        changes = {f.name: _replace_norms(getattr(spec, f.name), norm, old) for f in dataclasses.fields(spec)}
        return dataclasses.replace(spec, **changes)
    return spec


def linear_attention_pattern(hf_text_config: Any) -> list[int]:
    """1 for each gated delta net layer, 0 for full attention (layer_types, else every full_attention_interval-th)."""
    n = hf_text_config.num_hidden_layers
    types = getattr(hf_text_config, "layer_types", None)
    if not types:
        interval = getattr(hf_text_config, "full_attention_interval", 4)
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
    kinds = set(types[:n]) - {"linear_attention", "full_attention"}
    if kinds:
        raise ValueError(f"layer_types {sorted(kinds)} in the HF config: only linear_attention and full_attention")
    return [int(t == "linear_attention") for t in types[:n]]


def hybrid_block_spec(
    config: Any, local: bool, vp_stage: int | None = None, kernels: Any = None, torch_attention: str | None = None
) -> Any:
    """The decoder block spec of this pipeline stage: GDN or gated attention per layer (config.linear_attention_freq),
    MoE or dense MLP per layer (config.moe_layer_freq); on the local spec, with the faster paths `kernels` (a
    LocalKernels, local_kernels_flags.py) asks for, and torch's core attention on the `torch_attention` path."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_layer_specs
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    require_kernels()
    if not local:
        from megatron.core.models.gpt.experimental_attention_variant_module_specs import (
            get_transformer_block_with_experimental_attention_variant_spec,
        )

        spec = get_transformer_block_with_experimental_attention_variant_spec(config, vp_stage=vp_stage)
        gdn = _linear_attention_spec(local=False)
        for layer in spec.layer_specs:  # megatron's GDN: its out_norm would be zero-centered like the others
            if layer.submodules.self_attention.module is GatedDeltaNet:
                layer.submodules = dataclasses.replace(layer.submodules, self_attention=gdn)
        return spec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    pattern = config.linear_attention_freq
    norm = ZeroCenteredRMSNorm if config.layernorm_zero_centered_gamma else RMSNorm
    fused = kernels is not None and kernels.fused_elementwise
    if fused and norm is ZeroCenteredRMSNorm:
        # Layer, q/k and final norms. The gated out_norm stays RMSNorm: it already runs inside GatedDeltaNet's
        # _apply_gated_norm, which Megatron compiles with its silu gate (jit_fuser), as it does the gated attention's
        # sigmoid output gate. Qwen3-Next/3.5 norms are all zero-centred, so plain RMSNorm needs no fused twin here.
        norm = FusedZeroCenteredRMSNorm
    specs = get_gpt_decoder_layer_specs(config, use_transformer_engine=False, normalization=config.normalization)
    layers = []
    for i, layer in enumerate(specs):
        layer = _replace_norms(layer, norm, (WrappedTorchNorm,))
        if pattern[i]:
            layer.submodules = dataclasses.replace(layer.submodules, self_attention=_linear_attention_spec(local=True))
        layers.append(layer)
    offset = get_transformer_layer_offset(config, vp_stage=vp_stage)
    count = get_num_layers_to_build(config, vp_stage=vp_stage)
    spec = TransformerBlockSubmodules(layer_specs=layers[offset : offset + count], layer_norm=norm)
    if kernels is not None and kernels.grouped_experts:
        from slime_like.trainer.megatron.grouped_experts import use_grouped_experts

        use_grouped_experts(spec)  # the routed experts; the shared expert is one dense MLP (grouped_experts.py)
    if torch_attention is not None:
        from slime_like.trainer.megatron.torch_attention import use_torch_attention

        # The gated attention layers' core attention (its output gate is applied after it, by Attention); the engine
        # then packs micro-batches as THD, which PackedGatedDeltaNet splits by cu_seqlens.
        use_torch_attention(spec, torch_attention)
    return spec
