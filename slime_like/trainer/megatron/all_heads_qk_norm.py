"""QK norm over all heads at once (MiniMax-M2): one RMSNorm over the whole query projection (num_heads x head_dim)
and one over the whole key projection (num_key_value_heads x head_dim), before rope.

megatron-core 0.16's attention normalises each head on its own (a q/k_layernorm of head_dim). The layer spec names
the attention class, so a subclass swaps the per-head norms for whole-projection ones, without touching the layer;
their weights are `self_attention.q_norm.weight` and `self_attention.k_norm.weight`, whole on every TP rank.

Under tensor parallelism a rank holds some of the heads, but the variance is over all of them (SGLang all-reduces it
across its attention TP group): each rank's queries and keys are gathered over the TP group, normalised whole and
split back to the rank's heads. The gradient flows back the same way, so the norm weights stay identical on every
rank. Each rank must hold distinct key heads (TP size <= num_key_value_heads): a replicated key head would count
twice in the variance.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from megatron.core.transformer.attention import SelfAttention
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.spec_utils import build_module


class AllHeadsQKNormSelfAttention(SelfAttention):
    """Megatron's self-attention with RMSNorms over all query heads and all key heads jointly (MiniMax-M2)."""

    def __init__(self, config: Any, submodules: Any, *args: Any, **kwargs: Any) -> None:
        norm = submodules.q_layernorm
        if norm is None or norm is IdentityOp:
            raise ValueError("the all-heads QK norm needs qk_layernorm=True in the Megatron config (use_qk_norm)")
        if config.fused_single_qkv_rope:
            # The fused path takes the unsplit projection and would skip these norms.
            raise ValueError("fused_single_qkv_rope cannot apply MiniMax-M2's all-heads QK norm: turn it off")
        # The parent builds no per-head norms: its per-head step becomes a no-op.
        super().__init__(config, dataclasses.replace(submodules, q_layernorm=None, k_layernorm=None), *args, **kwargs)
        tp = self.tp_group.size() if self.tp_group is not None else 1
        if tp > config.num_query_groups:
            raise ValueError(
                f"--tensor-model-parallel-size {tp} is larger than num_key_value_heads={config.num_query_groups}: "
                "MiniMax-M2's key norm spans all key heads, which ranks then replicate (counted twice). Use a "
                f"tensor-parallel size of at most {config.num_query_groups}"
            )
        self._tp = tp
        head_dim = self.hidden_size_per_attention_head
        eps = config.layernorm_epsilon
        self.q_norm = build_module(norm, hidden_size=head_dim * config.num_attention_heads, config=config, eps=eps)
        self.k_norm = build_module(norm, hidden_size=head_dim * config.num_query_groups, config=config, eps=eps)

    def get_query_key_value_tensors(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        output_gate: bool = False,
        split_qkv: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Megatron's query, key and value, with the query and key normalised over all their heads."""
        if output_gate or not split_qkv:
            raise ValueError("MiniMax-M2's attention has no output gate and needs the split q/k/v path")
        query, key, value = super().get_query_key_value_tensors(hidden_states, key_value_states)
        return self._normalise(self.q_norm, query), self._normalise(self.k_norm, key), value

    def _normalise(self, norm: torch.nn.Module, heads: torch.Tensor) -> torch.Tensor:
        """[s, b, local heads, head_dim] normalised over every head of every TP rank."""
        from megatron.core.tensor_parallel import (
            gather_from_tensor_model_parallel_region,
            scatter_to_tensor_model_parallel_region,
        )

        flat = heads.reshape(*heads.shape[:-2], -1)
        if self._tp > 1:
            # Ranks hold consecutive heads in HF order: the gathered last dimension is the whole projection.
            whole = norm(gather_from_tensor_model_parallel_region(flat, group=self.tp_group))
            flat = scatter_to_tensor_model_parallel_region(whole, group=self.tp_group)
        else:
            flat = norm(flat)
        return flat.reshape(heads.shape)


def add_all_heads_qk_norm(spec: Any) -> Any:
    """The decoder block spec with every layer's self-attention normalising q and k over all heads."""
    for layer in spec.layer_specs:  # layers may share one spec object
        attention = layer.submodules.self_attention
        if attention.module is AllHeadsQKNormSelfAttention:
            continue
        if attention.module is not SelfAttention:
            raise ValueError(f"the all-heads QK norm needs Megatron's SelfAttention layers, not {attention.module}")
        attention.module = AllHeadsQKNormSelfAttention
    return spec
