"""Parameters and KV-cache cost of a model, counted from its HF config for the planner (slime_like/planner.py).

The count is the language model's as transformers builds it (dense and MoE layers, DeepSeek-style multi-latent
attention, the gated delta net layers of hybrid models), without MTP layers or a vision tower; the tests hold it to
transformers' own count of every reference config (tools/reference_configs.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slime_like.core.hf_config import hf_field
from slime_like.trainer.model_arguments import expert_width, moe_layer_pattern, shared_expert_width


@dataclass
class ModelSize:
    """Parameter counts and KV-cache cost of one model."""

    dense_params: int  # everything that is not a routed expert
    expert_params: int  # all routed experts of all layers
    layers: int
    hidden: int
    kv_bytes_per_token: int  # 16-bit K and V (or the MLA latent) over the layers that keep a KV cache
    served_bytes_per_param: int = 2  # what SGLang loads the checkpoint as: 16-bit, or 1 byte for FP8 checkpoints

    @property
    def total(self) -> int:
        """All parameters."""
        return self.dense_params + self.expert_params


def _linear_attention(config: Any) -> tuple[int, int]:
    """(gated delta net layers, parameters of one) of a hybrid model (Qwen3-Next, Qwen3.5); (0, 0) for others."""
    value_heads = hf_field(config, "linear_num_value_heads")
    if not value_heads:
        return 0, 0
    h, layers = hf_field(config, "hidden_size"), hf_field(config, "num_hidden_layers")
    interval = hf_field(config, "full_attention_interval", 4)
    every = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)]
    types = hf_field(config, "layer_types") or every
    key_dim = hf_field(config, "linear_num_key_heads") * hf_field(config, "linear_key_head_dim")
    head_v = hf_field(config, "linear_value_head_dim")
    value_dim = value_heads * head_v
    # As transformers' Qwen3NextGatedDeltaNet: q, k, v, z and per value head beta, alpha projected from the input;
    # q, k, v convolved depthwise; dt_bias and A_log per value head; a norm over one value head; the output projection.
    params = (
        h * (2 * key_dim + 2 * value_dim + 2 * value_heads)
        + (2 * key_dim + value_dim) * hf_field(config, "linear_conv_kernel_dim")
        + 2 * value_heads
        + head_v
        + value_dim * h
    )
    return sum(kind == "linear_attention" for kind in types[:layers]), params


def model_size(config: Any) -> ModelSize:
    """Count parameters from an HF config, outer or nested (dense, MoE, DeepSeek-style MLA attention, and the gated
    delta net layers of hybrid models); the language model only, without MTP layers or a vision tower."""
    h, layers, vocab = (hf_field(config, f) for f in ("hidden_size", "num_hidden_layers", "vocab_size"))
    heads = hf_field(config, "num_attention_heads")
    kv_lora = hf_field(config, "kv_lora_rank")
    linear_layers, linear_params = _linear_attention(config)
    full_layers = layers - linear_layers  # only these keep a KV cache
    if kv_lora:  # multi-latent attention
        q_lora = hf_field(config, "q_lora_rank")
        nope, rope, v_dim = (hf_field(config, f) for f in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
        q = (h * q_lora + q_lora + q_lora * heads * (nope + rope)) if q_lora else h * heads * (nope + rope)
        kv = h * (kv_lora + rope) + kv_lora + kv_lora * heads * (nope + v_dim)
        attention = q + kv + heads * v_dim * h
        kv_per_token = full_layers * (kv_lora + rope) * 2  # the latent is what is cached
    else:
        head_dim = hf_field(config, "head_dim") or h // heads
        kv_heads = hf_field(config, "num_key_value_heads") or heads
        gate = 2 if linear_layers else 1  # hybrid models' full attention also projects an output gate per head
        attention = gate * h * heads * head_dim + 2 * h * kv_heads * head_dim + heads * head_dim * h
        if hf_field(config, "model_type").startswith("qwen3"):
            attention += 2 * head_dim  # RMSNorm on queries and keys
        kv_per_token = full_layers * 2 * kv_heads * head_dim * 2
    experts = hf_field(config, "num_experts", 0)
    dense_mlp = 3 * h * hf_field(config, "intermediate_size", 0)
    pattern = moe_layer_pattern(config)
    moe_layers = sum(pattern[1]) if pattern else 0
    moe_dense_part = h * experts + 3 * h * shared_expert_width(config)[1]  # router and shared experts of a MoE layer
    expert_params = moe_layers * experts * 3 * h * (expert_width(config)[1] or 0)
    per_layer_norms = 2 * h
    dense = (
        full_layers * attention
        + linear_layers * linear_params
        + layers * per_layer_norms
        + (layers - moe_layers) * dense_mlp
        + moe_layers * moe_dense_part
    )
    embeddings = vocab * h * (1 if hf_field(config, "tie_word_embeddings", False) else 2) + h
    quantization = hf_field(config, "quantization_config", {})
    fp8 = isinstance(quantization, dict) and quantization.get("quant_method") == "fp8"  # Kimi-K2, GLM-5-FP8, ...
    return ModelSize(dense + embeddings, expert_params, layers, h, kv_per_token, 1 if fp8 else 2)
