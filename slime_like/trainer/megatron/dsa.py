"""GLM-5's DeepSeek sparse attention (DSA) on megatron-core 0.16: MLA whose queries attend only to the top-k keys a
lightning indexer picks (megatron/core/transformer/experimental_attention_variant/dsa.py).

What megatron-core's modules need here, and why:
- Kernel: DSAIndexer rotates its queries and keys with a Hadamard transform from `fast_hadamard_transform` (a CUDA
  extension; bf16 only). On GPU it is required (`require_kernels` names the package at start). Without CUDA the same
  orthonormal transform is a matmul with the normalised Sylvester-Hadamard matrix (`torch_rotate_activation`), in any
  dtype. The sparse attention itself is plain torch in megatron-core (no TileLang / FlashMLA kernel).
- Layout of the indexer heads: HF (transformers, SGLang) puts the rotary part first in each indexer head
  ([rope, rest]); megatron-core puts it last. `HFLayoutIndexer` rotates the first `qk_rope_head_dim` dimensions, so
  HF tensors load unchanged (bit-exact both ways). `indexer_rope_interleave` (GLM-5: true, as SGLang reads it;
  transformers 5 ignores it and rotates halves) picks pairs or halves. The key norm is a LayerNorm with eps 1e-6, as
  in SGLang and transformers (megatron-core would take the model's RMSNorm eps).
- Masks: megatron-core's DSAttention builds a causal mask and ignores the attention mask, so sequences packed in one
  row would attend to each other whenever the indexer picks fewer real keys than top-k. `MaskedDSAttention` scores
  and attends with the block-diagonal causal mask of the row. THD (Transformer Engine's packed rows) is refused:
  megatron-core's indexer does not take `cu_seqlens`; use the "padded" micro-batch layout on GPU.
- Training: megatron-core detaches the indexer's inputs, so the policy loss never reaches it; its own KL loss
  (`dsa_indexer_loss_coeff`) is off here, so the indexer keeps its checkpoint weights (as the rollout's).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from functools import cache
from typing import Any

import torch
from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd
from megatron.core.transformer.experimental_attention_variant import dsa as _dsa
from megatron.core.transformer.experimental_attention_variant.dsa import (
    DSAIndexer,
    DSAIndexerSubmodules,
    DSAttention,
    DSAttentionSubmodules,
)
from megatron.core.transformer.spec_utils import ModuleSpec

HADAMARD_INSTALL = "pip install fast-hadamard-transform"
INDEXER_NORM_EPS = 1e-6  # HF's (and SGLang's) indexer k_norm


@cache
def _hadamard(size: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """The size x size Sylvester-Hadamard matrix scaled by size**-0.5 (orthonormal and symmetric)."""
    if size & (size - 1):
        raise ValueError(f"index_head_dim={size}: the indexer's Hadamard rotation needs a power of two")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < size:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h * size**-0.5).to(dtype=dtype, device=device)


def torch_rotate_activation(x: torch.Tensor) -> torch.Tensor:
    """megatron-core's rotate_activation (fast_hadamard_transform with scale d**-0.5) as a matmul, any dtype."""
    return x @ _hadamard(x.shape[-1], x.dtype, str(x.device))


def require_kernels(dtype: torch.dtype) -> None:
    """Give DSAIndexer its Hadamard rotation: fast_hadamard_transform on GPU (an error naming the package when it is
    missing, or when the model is not bf16, the only dtype the kernel takes), the torch matmul without CUDA."""
    from slime_like.trainer.megatron.cpu_compat import ON_CUDA

    if not ON_CUDA:
        _dsa.rotate_activation = torch_rotate_activation
        return
    if _dsa.hadamard_transform is None:
        raise ImportError(
            "GLM-5's sparse attention indexer (megatron-core DSA) needs the fast_hadamard_transform CUDA kernel on "
            f"GPU: `{HADAMARD_INSTALL}`"
        )
    if dtype is not torch.bfloat16:
        raise ValueError("GLM-5 (DSA) on GPU runs in bf16 only (fast_hadamard_transform takes bf16): pass --bf16")


class DuplicatedLinear(torch.nn.Module):
    """A bias-free linear layer held whole on every tensor-parallel rank (the local spec's `parallel_mode=duplicated`
    linear; Transformer Engine's is TELinear). Returns (output, None) like Megatron's linears."""

    def __init__(self, input_size: int, output_size: int, *, config: Any, init_method: Any, **_: Any) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(output_size, input_size, dtype=config.params_dtype))
        if config.perform_initialization:
            init_method(self.weight)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        """x @ weight.T."""
        return torch.nn.functional.linear(x, self.weight), None


class HFLayoutIndexer(DSAIndexer):
    """megatron-core's DSA indexer with HF's head layout: rope on the first qk_rope_head_dim dimensions of each head
    (pairs when rope_interleaved, halves otherwise), key norm eps 1e-6."""

    def __init__(self, config: Any, *args: Any, rope_interleaved: bool = True, **kwargs: Any) -> None:
        # DSAIndexer builds its key norm with the model's norm eps; the config is otherwise read unchanged.
        config = copy.copy(config)
        config.layernorm_epsilon = INDEXER_NORM_EPS
        super().__init__(config, *args, **kwargs)
        self.rope_interleaved = rope_interleaved

    def _apply_rope(self, x: torch.Tensor, rotary_pos_emb: torch.Tensor, mscale: float) -> torch.Tensor:
        """x [s, b, heads, index_head_dim] with its first qk_pos_emb_head_dim dimensions rotated."""
        rope = self.qk_pos_emb_head_dim
        x_pe, x_rest = torch.split(x, [rope, self.index_head_dim - rope], dim=-1)
        # Megatron's MLA mode takes even/odd pairs to halves before rotating halves: the pairwise (GPT-J) rope, up to
        # a permutation that q and k share (dot products unchanged); without it, rotate-half on the halves.
        x_pe = _apply_rotary_pos_emb_bshd(
            x_pe, rotary_pos_emb, rotary_interleaved=False, multi_latent_attention=self.rope_interleaved, mscale=mscale
        )
        return torch.cat([x_pe, x_rest], dim=-1)


def _masked_positions(attention_mask: torch.Tensor | None, batch: int, sq: int, skv: int, device: Any) -> torch.Tensor:
    """Bool [b, sq, skv], True where a query must not see a key: the row's mask (block-diagonal causal when several
    sequences are packed) and causality."""
    causal = torch.ones(sq, skv, dtype=torch.bool, device=device).triu(1)
    if attention_mask is None:
        return causal.expand(batch, sq, skv)
    return attention_mask.reshape(-1, sq, skv).expand(batch, sq, skv) | causal


def sparse_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    topk: torch.Tensor,
    masked: torch.Tensor,
    softmax_scale: float,
) -> torch.Tensor:
    """Softmax attention of each query over the top-k keys the indexer chose, minus the masked ones.

    query/key [s, b, heads, d], value [s, b, heads, dv], topk [b, sq, k], masked [b, sq, skv] -> [sq, b, heads * dv].
    A row with fewer visible keys than k gets masked picks too; the mask keeps them out (the query's own key is
    always visible and always scores, so no row is empty)."""
    sq, b, heads, _ = query.shape
    skv = key.shape[0]
    scores = torch.einsum("sbhd,tbhd->bhst", query.float(), key.float()) * softmax_scale
    allowed = torch.zeros(b, sq, skv, dtype=torch.bool, device=query.device).scatter_(-1, topk.long(), True)
    allowed &= ~masked
    scores = scores.masked_fill(~allowed.unsqueeze(1), float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.einsum("bhst,tbhd->sbhd", probs, value)
    return out.reshape(sq, b, heads * value.shape[-1])


class MaskedDSAttention(DSAttention):
    """megatron-core's DSAttention with the row's attention mask applied to the indexer's scores and to the sparse
    attention (megatron-core applies only causality, which mixes sequences packed in one row)."""

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        x: torch.Tensor,
        qr: torch.Tensor,
        attn_mask_type: Any = None,
        attention_bias: Any = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        """[sq, b, heads * v_head_dim]: each query attends to its top-k visible keys."""
        if packed_seq_params is not None:
            raise ValueError(
                "GLM-5 (DSA) cannot take packed THD micro-batches: megatron-core 0.16's indexer has no cu_seqlens. "
                "Set SLIME_LIKE_MICRO_BATCH_LAYOUT=padded"
            )
        sq, b = query.shape[:2]
        masked = _masked_positions(attention_mask, b, sq, key.shape[0], query.device)
        float_mask = torch.zeros(masked.shape, dtype=torch.float32, device=query.device).masked_fill(
            masked, float("-inf")
        )
        # As in megatron-core: the indexer sees detached inputs (its gradient would come only from its KL loss).
        _, topk = self.indexer.forward_with_scores(x.detach(), qr.detach(), mask=float_mask)
        return sparse_attention(query, key, value, topk, masked, self.softmax_scale)


def dsa_core_attention(local: bool, rope_interleaved: bool) -> ModuleSpec:
    """The core-attention spec of a DSA layer: MaskedDSAttention with an HF-layout indexer."""
    if local:
        from megatron.core.transformer.torch_norm import WrappedTorchNorm

        linear, norm = DuplicatedLinear, WrappedTorchNorm
    else:
        from megatron.core.extensions.transformer_engine import TELinear, TENorm

        linear, norm = TELinear, TENorm
    indexer = ModuleSpec(
        module=HFLayoutIndexer,
        params={"rope_interleaved": rope_interleaved},
        submodules=DSAIndexerSubmodules(linear_wq_b=linear, linear_wk=linear, k_norm=norm, linear_weights_proj=linear),
    )
    return ModuleSpec(module=MaskedDSAttention, submodules=DSAttentionSubmodules(indexer=indexer))


def add_dsa(spec: Any, local: bool, rope_interleaved: bool) -> Any:
    """The decoder block spec with every MLA layer's core attention made DSA (GLM-5 runs the indexer in every
    layer)."""
    from megatron.core.transformer.multi_latent_attention import MLASelfAttention

    core = dsa_core_attention(local, rope_interleaved)
    for layer in spec.layer_specs:
        attention = layer.submodules.self_attention
        if attention.module is not MLASelfAttention:
            raise ValueError(f"GLM-5's layers are MLA; the layer spec has {attention.module.__name__}")
        attention.submodules = dataclasses.replace(attention.submodules, core_attention=core)
    return spec


def indexer_types(hf_config: Any) -> list[str]:
    """Each layer's indexer mode: "full" (its own top-k) or "shared" (the previous full layer's), from the config's
    indexer_types or index_topk_freq / index_skip_topk_offset / index_topk_pattern (transformers' reading)."""
    n = hf_config.num_hidden_layers
    types = getattr(hf_config, "indexer_types", None)
    if types:
        return list(types[:n])
    pattern = getattr(hf_config, "index_topk_pattern", None)
    if pattern:
        return [{"F": "full", "S": "shared"}[c] for c in pattern[:n]]
    freq = max(getattr(hf_config, "index_topk_freq", 1) or 1, 1)
    offset = getattr(hf_config, "index_skip_topk_offset", 2)
    return ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]


def dsa_config_args(hf_config: Any, dtype: torch.dtype) -> dict[str, Any]:
    """Megatron TransformerConfig fields of GLM-5's sparse attention (a ValueError for what megatron-core cannot
    run: shared top-k layers, context parallelism, THD micro-batches on GPU)."""
    from megatron.core import parallel_state as mpu

    require_kernels(dtype)
    shared = [i for i, kind in enumerate(indexer_types(hf_config)) if kind != "full"]
    if shared:
        raise ValueError(
            f"layers {shared} of the HF config reuse an earlier layer's top-k (indexer_types 'shared' / "
            "index_topk_freq > 1): megatron-core's DSA runs an indexer in every layer"
        )
    if mpu.get_context_parallel_world_size() > 1:
        raise ValueError(
            "--context-parallel-size > 1: megatron-core 0.16's DSA has no context parallelism (slime's --allgather-cp "
            "needs its own GLM-5 spec); use --context-parallel-size 1"
        )
    from slime_like.trainer.megatron.cpu_compat import transformer_engine_available

    if transformer_engine_available() and os.environ.get("SLIME_LIKE_MICRO_BATCH_LAYOUT") != "padded":
        raise ValueError(
            "GLM-5 (DSA) with Transformer Engine needs one sequence per micro-batch row: megatron-core 0.16's "
            "indexer cannot take packed THD rows. Set SLIME_LIKE_MICRO_BATCH_LAYOUT=padded"
        )
    return dict(
        experimental_attention_variant="dsa",
        dsa_indexer_n_heads=hf_config.index_n_heads,
        dsa_indexer_head_dim=hf_config.index_head_dim,
        dsa_indexer_topk=hf_config.index_topk,
        dsa_indexer_loss_coeff=0.0,
        apply_rope_fusion=False,
    )
