"""The explicit registry of model families: Megatron <-> HF parameter names, by HF `model_type`.

Each family names the mbridge bridge that builds its Megatron model and a plain name map from
Megatron parameter names (with `{layer}` and `{expert}` placeholders, global numbering) to the HF
tensors they are made of, with how they combine:
- "copy": one HF tensor, same layout;
- "qkv": q, k, v projections fused per query group (Megatron's layout: [q of the group, k, v]);
- "gate_up": gate and up projections stacked (the SwiGLU fc1);
- "fused_gate_up": the same fc1 stored as one HF tensor (GLM-4's gate_up_proj);
- "vocab": embedding / output rows, padded in Megatron to a multiple of its vocabulary divisor.

Megatron names are those of the local layer spec (what runs on CPU); Transformer Engine's names for
the same parameters are translated by TE_ALIASES first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from slime_like.megatron import bridges

_L = "model.layers.{layer}"
_M = "decoder.layers.{layer}"


@dataclass(frozen=True)
class Rule:
    """How one Megatron parameter is made of HF tensors."""

    hf: tuple[str, ...]
    kind: str = "copy"  # copy | qkv | gate_up | fused_gate_up | vocab


@dataclass(frozen=True)
class Family:
    """A model family: the mbridge bridge class that builds it and its name map."""

    bridge: type
    rules: dict[str, Rule]


def _copy(name: str) -> Rule:
    return Rule((name,))


def _gate_up(prefix: str) -> Rule:
    return Rule((f"{prefix}.gate_proj.weight", f"{prefix}.up_proj.weight"), "gate_up")


_EMBEDDINGS = {
    "embedding.word_embeddings.weight": Rule(("model.embed_tokens.weight",), "vocab"),
    "decoder.final_layernorm.weight": _copy("model.norm.weight"),
    "output_layer.weight": Rule(("lm_head.weight",), "vocab"),
}
_LAYER_NORMS = {
    f"{_M}.input_layernorm.weight": _copy(f"{_L}.input_layernorm.weight"),
    f"{_M}.pre_mlp_layernorm.weight": _copy(f"{_L}.post_attention_layernorm.weight"),
}
_GQA_ATTENTION = {
    f"{_M}.self_attention.linear_qkv.weight": Rule(tuple(f"{_L}.self_attn.{p}_proj.weight" for p in "qkv"), "qkv"),
    f"{_M}.self_attention.linear_qkv.bias": Rule(tuple(f"{_L}.self_attn.{p}_proj.bias" for p in "qkv"), "qkv"),
    f"{_M}.self_attention.linear_proj.weight": _copy(f"{_L}.self_attn.o_proj.weight"),
}
_QK_NORM = {
    f"{_M}.self_attention.q_layernorm.weight": _copy(f"{_L}.self_attn.q_norm.weight"),
    f"{_M}.self_attention.k_layernorm.weight": _copy(f"{_L}.self_attn.k_norm.weight"),
}
_DENSE_MLP = {
    f"{_M}.mlp.linear_fc1.weight": _gate_up(f"{_L}.mlp"),
    f"{_M}.mlp.linear_fc2.weight": _copy(f"{_L}.mlp.down_proj.weight"),
}
_ROUTED_EXPERTS = {
    f"{_M}.mlp.router.weight": _copy(f"{_L}.mlp.gate.weight"),
    f"{_M}.mlp.experts.local_experts.{{expert}}.linear_fc1.weight": _gate_up(f"{_L}.mlp.experts.{{expert}}"),
    f"{_M}.mlp.experts.local_experts.{{expert}}.linear_fc2.weight": _copy(
        f"{_L}.mlp.experts.{{expert}}.down_proj.weight"
    ),
}
_MLA_ATTENTION = {
    f"{_M}.self_attention.linear_q_proj.weight": _copy(f"{_L}.self_attn.q_proj.weight"),  # q_lora_rank None
    f"{_M}.self_attention.linear_q_down_proj.weight": _copy(f"{_L}.self_attn.q_a_proj.weight"),
    f"{_M}.self_attention.q_layernorm.weight": _copy(f"{_L}.self_attn.q_a_layernorm.weight"),
    f"{_M}.self_attention.linear_q_up_proj.weight": _copy(f"{_L}.self_attn.q_b_proj.weight"),
    f"{_M}.self_attention.linear_kv_down_proj.weight": _copy(f"{_L}.self_attn.kv_a_proj_with_mqa.weight"),
    f"{_M}.self_attention.kv_layernorm.weight": _copy(f"{_L}.self_attn.kv_a_layernorm.weight"),
    f"{_M}.self_attention.linear_kv_up_proj.weight": _copy(f"{_L}.self_attn.kv_b_proj.weight"),
    f"{_M}.self_attention.linear_proj.weight": _copy(f"{_L}.self_attn.o_proj.weight"),
}
_DEEPSEEK_MOE = {
    **_ROUTED_EXPERTS,
    f"{_M}.mlp.router.expert_bias": _copy(f"{_L}.mlp.gate.e_score_correction_bias"),
    f"{_M}.mlp.shared_experts.linear_fc1.weight": _gate_up(f"{_L}.mlp.shared_experts"),
    f"{_M}.mlp.shared_experts.linear_fc2.weight": _copy(f"{_L}.mlp.shared_experts.down_proj.weight"),
}

_DENSE_GQA = {**_EMBEDDINGS, **_LAYER_NORMS, **_GQA_ATTENTION, **_DENSE_MLP}
_DEEPSEEK_V3 = {**_EMBEDDINGS, **_LAYER_NORMS, **_MLA_ATTENTION, **_DENSE_MLP, **_DEEPSEEK_MOE}


def _families() -> dict[str, Family]:
    from mbridge.models import Qwen2Bridge, Qwen3Bridge, Qwen3MoEBridge

    return {
        "qwen2": Family(Qwen2Bridge, _DENSE_GQA),
        "qwen3": Family(Qwen3Bridge, {**_DENSE_GQA, **_QK_NORM}),
        "llama": Family(bridges.Llama3Bridge, _DENSE_GQA),
        # Dense layers (mlp_only_layers) keep the dense MLP names.
        "qwen3_moe": Family(Qwen3MoEBridge, {**_DENSE_GQA, **_QK_NORM, **_ROUTED_EXPERTS}),
        "deepseek_v3": Family(bridges.DeepseekV3CoreBridge, _DEEPSEEK_V3),
        # Kimi-K2: DeepSeek-V3's architecture under its own model_type (its config class is the checkpoint's code).
        "kimi_k2": Family(bridges.DeepseekV3CoreBridge, _DEEPSEEK_V3),
        # GLM-4.7-Flash: DeepSeek-V3's architecture; its dense layers are listed in mlp_layer_types.
        "glm4_moe_lite": Family(bridges.DeepseekV3CoreBridge, _DEEPSEEK_V3),
        # GLM-4-0414 / GLM-Z1: the sandwich norms are post-norms inside attention and MLP (sandwich_norms.py).
        "glm4": Family(
            bridges.Glm4Bridge,
            {
                **_DENSE_GQA,
                f"{_M}.mlp.linear_fc1.weight": Rule((f"{_L}.mlp.gate_up_proj.weight",), "fused_gate_up"),
                f"{_M}.self_attention.post_layernorm.weight": _copy(f"{_L}.post_self_attn_layernorm.weight"),
                f"{_M}.mlp.post_layernorm.weight": _copy(f"{_L}.post_mlp_layernorm.weight"),
            },
        ),
        # GLM-4.5/4.6/4.7: qkv bias and QK norm map when the config has them; dense first_k_dense_replace layers.
        "glm4_moe": Family(bridges.Glm4MoeCoreBridge, {**_DENSE_GQA, **_QK_NORM, **_DEEPSEEK_MOE}),
        # MiMo-7B: Qwen2's main layers under their usual names; its MTP layers (model.mtp_layers) are not built.
        "mimo": Family(bridges.MimoBridge, _DENSE_GQA),
    }


FAMILIES: dict[str, Family] = _families()

# Transformer Engine spec name -> local spec name (TE fuses norms into the next linear and groups experts).
TE_ALIASES = {
    f"{_M}.self_attention.linear_qkv.layer_norm_weight": f"{_M}.input_layernorm.weight",
    f"{_M}.mlp.linear_fc1.layer_norm_weight": f"{_M}.pre_mlp_layernorm.weight",
    f"{_M}.self_attention.linear_q_up_proj.layer_norm_weight": f"{_M}.self_attention.q_layernorm.weight",
    f"{_M}.self_attention.linear_kv_up_proj.layer_norm_weight": f"{_M}.self_attention.kv_layernorm.weight",
    f"{_M}.mlp.experts.linear_fc1.weight{{expert}}": f"{_M}.mlp.experts.local_experts.{{expert}}.linear_fc1.weight",
    f"{_M}.mlp.experts.linear_fc2.weight{{expert}}": f"{_M}.mlp.experts.local_experts.{{expert}}.linear_fc2.weight",
}

_LAYER = re.compile(r"(?<=\blayers\.)(\d+)(?=\.)")
_LOCAL_EXPERT = re.compile(r"(?<=\.local_experts\.)(\d+)(?=\.)")
_TE_EXPERT = re.compile(r"(?<=\.experts\.linear_fc[12]\.weight)(\d+)$")


def family_of(hf_config: Any) -> Family:
    """The registered family of an HF config, or a ValueError naming its model_type and the known ones."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in FAMILIES:
        raise ValueError(f"model_type {model_type!r} is not supported; registered families: {sorted(FAMILIES)}")
    return FAMILIES[model_type]


def template(name: str) -> tuple[str, int | None, int | None]:
    """A Megatron name as (local-spec template, layer number, expert number), e.g.
    'decoder.layers.3.mlp.experts.linear_fc1.weight5' -> ('decoder.layers.{layer}.mlp.experts.local_experts.
    {expert}.linear_fc1.weight', 3, 5)."""
    layer = expert = None
    if m := _LAYER.search(name):
        layer = int(m.group(1))
        name = name[: m.start()] + "{layer}" + name[m.end() :]
    if m := _LOCAL_EXPERT.search(name) or _TE_EXPERT.search(name):
        expert = int(m.group(1))
        name = name[: m.start()] + "{expert}" + name[m.end() :]
    return TE_ALIASES.get(name, name), layer, expert


def rules_for(hf_config: Any) -> dict[str, Rule]:
    """The family's name map for this config (the output layer reads the embedding when tied)."""
    rules = dict(family_of(hf_config).rules)
    if getattr(hf_config, "tie_word_embeddings", False):
        rules["output_layer.weight"] = Rule(("model.embed_tokens.weight",), "vocab")
    return rules
