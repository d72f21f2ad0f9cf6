"""Reading a Hugging Face checkpoint's config: loading it (the one place the engine calls AutoConfig.from_pretrained)
and reading its fields, the one way every reader of an HF config goes through.

Published checkpoints name the same quantity differently, and many bring their own config code written for
transformers 4 (DeepSeek-V3's configuration_deepseek.py, MiniMax-M2's configuration_minimax_m2.py): standalone
PretrainedConfig classes with no attribute_map, so transformers' own aliases (num_experts -> num_local_experts, ...)
do not apply. Multimodal checkpoints (Qwen3.5 / 3.6) nest the language model under `text_config`. `hf_field` reads
the language model's config under every published name of a field; `rope_parameters` gathers the RoPE settings from
wherever transformers 4 or 5 keeps them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# A field -> every name published configs store it under, tried in this order (the first present counts).
FIELD_NAMES: dict[str, tuple[str, ...]] = {
    # Routed experts per MoE layer: DeepSeek-V3 / Kimi-K2 / GLM say n_routed_experts, Mixtral / MiniMax-M2 (and
    # transformers 5's Qwen3-MoE) num_local_experts, Qwen3-Next / Qwen3.5 num_experts. num_experts comes last:
    # transformers' GLM-5 class keeps a num_experts default beside the checkpoint's n_routed_experts.
    "num_experts": ("n_routed_experts", "num_local_experts", "num_experts"),
    # Width of the shared expert: Qwen's; some configs prefix it with moe_; MiniMax-M2's (0: none).
    "shared_expert_intermediate_size": (
        "shared_expert_intermediate_size",
        "moe_shared_expert_intermediate_size",
        "shared_intermediate_size",
    ),
    # MTP layers the checkpoint carries: DeepSeek / GLM / MiMo nextn layers, Qwen3.5's, MiniMax-M2's modules.
    "mtp_num_layers": ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules", "num_mtp_layers"),
}
# Fields the outer config of a nested one decides: transformers' *ForConditionalGeneration ties its LM head by its own
# tie_word_embeddings (Qwen3-VL-MoE's text config defaults to true beside the published outer false).
OUTER_FIELDS = ("tie_word_embeddings",)


def load_hf_config(path: str | Path) -> Any:
    """The transformers config of an HF checkpoint directory, custom configuration code included.

    Like slime, this trusts the checkpoint's own code: Kimi-K2's config.json has model_type "kimi_k2" and an
    auto_map to configuration_deepseek.py in the same directory, which transformers runs only when asked to.
    """
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(path), trust_remote_code=True)


def text_config(config: Any) -> Any:
    """The language model's config: Qwen3.5 (and multimodal models) nest it under `text_config`, as slime reads it."""
    nested = getattr(config, "text_config", None)
    return nested if nested is not None else config


def hf_field_named(config: Any, field: str) -> tuple[str, Any]:
    """(the name it was found under, its value) of `field` in an HF config, outer or nested; (field, None) if absent.

    The language model's config is read first; a field only the outer config holds (a multimodal checkpoint's
    quantization_config) is read there, and OUTER_FIELDS are read there first.
    """
    names = FIELD_NAMES.get(field, (field,))
    text = text_config(config)
    sources = (text, config) if text is not config else (text,)
    for source in reversed(sources) if field in OUTER_FIELDS else sources:
        for name in names:
            value = getattr(source, name, None)
            if value is not None:
                return name, value
    return field, None


def hf_field(config: Any, field: str, default: Any = None) -> Any:
    """The value of `field` in an HF config under any of its published names (`default` if absent)."""
    value = hf_field_named(config, field)[1]
    return default if value is None else value


def rope_parameters(config: Any) -> dict[str, Any]:
    """RoPE settings as one dict (rope_theta, rope_type or type, factor, partial_rotary_factor, ...), wherever the
    config keeps them: transformers 5 in rope_parameters, transformers-4 configs in rope_scaling plus a top-level
    rope_theta and partial_rotary_factor. Keys the config does not give are absent."""
    text = text_config(config)
    rope = dict(getattr(text, "rope_scaling", None) or {})
    rope.update(getattr(text, "rope_parameters", None) or {})
    for key in ("rope_theta", "partial_rotary_factor"):
        if rope.get(key) is None and getattr(text, key, None) is not None:
            rope[key] = getattr(text, key)
    return rope
