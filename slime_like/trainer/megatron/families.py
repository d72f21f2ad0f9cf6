"""The explicit registry of model families: Megatron <-> HF parameter names, by HF `model_type`.

Each family names the mbridge bridge that builds its Megatron model and a plain name map from
Megatron parameter names (with `{layer}` and `{expert}` placeholders, global numbering) to the HF
tensors they are made of, with how they combine:
- "copy": one HF tensor, same layout;
- "qkv": q, k, v projections fused per query group (Megatron's layout: [q of the group, k, v]);
- "gate_up": gate and up projections stacked (the SwiGLU fc1);
- "fused_gate_up": the same fc1 stored as one HF tensor (GLM-4's gate_up_proj);
- "vocab": embedding / output rows, padded in Megatron to a multiple of its vocabulary divisor;
- "expert_gate_up" / "expert_down": one expert's slice of a layer's stacked experts tensor (stacked_experts.py).

Megatron names are those of the local layer spec (what runs on CPU); Transformer Engine's names for
the same parameters are translated by TE_ALIASES first.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any

_L = "model.layers.{layer}"
_M = "decoder.layers.{layer}"


@dataclass(frozen=True)
class Rule:
    """How one Megatron parameter is made of HF tensors."""

    hf: tuple[str, ...]
    kind: str = "copy"  # copy | qkv | gate_up | fused_gate_up | vocab | swap_halves | expert_gate_up | expert_down
    layer_offset: int = 0  # added to the layer number in the HF names (DeepSeek's MTP layers follow the main ones)


@dataclass(frozen=True)
class Family:
    """A model family: the mbridge bridge class that builds it and its name map."""

    # "module:class" of the bridge, imported when first used: mbridge imports Megatron (~3.6 s on our CPUs), which
    # the start-up checks (slime_like/arguments.py: family_problem) and the dry runs need not pay.
    bridge_path: str
    rules: dict[str, Rule]

    @property
    def bridge(self) -> type:
        """The bridge class."""
        module, name = self.bridge_path.split(":")
        return getattr(importlib.import_module(module), name)


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
_MOE = f"{_L}.block_sparse_moe"
_MINIMAX_M2 = {
    **_EMBEDDINGS,
    **_LAYER_NORMS,
    **_GQA_ATTENTION,
    # One norm over all query heads and one over all key heads (slime_like.trainer.megatron.all_heads_qk_norm).
    f"{_M}.self_attention.q_norm.weight": _copy(f"{_L}.self_attn.q_norm.weight"),
    f"{_M}.self_attention.k_norm.weight": _copy(f"{_L}.self_attn.k_norm.weight"),
    f"{_M}.mlp.router.weight": _copy(f"{_MOE}.gate.weight"),
    f"{_M}.mlp.router.expert_bias": _copy(f"{_MOE}.e_score_correction_bias"),
    f"{_M}.mlp.experts.local_experts.{{expert}}.linear_fc1.weight": Rule(
        (f"{_MOE}.experts.{{expert}}.w1.weight", f"{_MOE}.experts.{{expert}}.w3.weight"), "gate_up"
    ),
    f"{_M}.mlp.experts.local_experts.{{expert}}.linear_fc2.weight": _copy(f"{_MOE}.experts.{{expert}}.w2.weight"),
}
_DEEPSEEK_V3 = {**_EMBEDDINGS, **_LAYER_NORMS, **_MLA_ATTENTION, **_DENSE_MLP, **_DEEPSEEK_MOE}
_DSA = f"{_M}.self_attention.core_attention.indexer"
# GLM-5: DeepSeek-V3's layers plus the DSA indexer of each layer (slime_like.trainer.megatron.dsa keeps HF's head layout).
_GLM_MOE_DSA = {
    **_DEEPSEEK_V3,
    f"{_DSA}.linear_wq_b.weight": _copy(f"{_L}.self_attn.indexer.wq_b.weight"),
    f"{_DSA}.linear_wk.weight": _copy(f"{_L}.self_attn.indexer.wk.weight"),
    f"{_DSA}.k_norm.weight": _copy(f"{_L}.self_attn.indexer.k_norm.weight"),
    f"{_DSA}.k_norm.bias": _copy(f"{_L}.self_attn.indexer.k_norm.bias"),
    f"{_DSA}.linear_weights_proj.weight": _copy(f"{_L}.self_attn.indexer.weights_proj.weight"),
}


def _qwen3_next(prefix: str, in_proj: Rule) -> dict[str, Rule]:
    """Qwen3-Next / Qwen3.5 layers under an HF layer prefix: gated attention or gated delta net (linear_attn),
    then a dense MLP or softmax MoE with a gated shared expert."""
    a, la, mlp = f"{prefix}.self_attn", f"{prefix}.linear_attn", f"{prefix}.mlp"
    return {
        f"{_M}.input_layernorm.weight": _copy(f"{prefix}.input_layernorm.weight"),
        f"{_M}.pre_mlp_layernorm.weight": _copy(f"{prefix}.post_attention_layernorm.weight"),
        # Gated attention: q_proj holds each head's query and output gate.
        f"{_M}.self_attention.linear_qkv.weight": Rule(tuple(f"{a}.{p}_proj.weight" for p in "qkv"), "gated_qkv"),
        f"{_M}.self_attention.linear_proj.weight": _copy(f"{a}.o_proj.weight"),
        f"{_M}.self_attention.q_layernorm.weight": _copy(f"{a}.q_norm.weight"),
        f"{_M}.self_attention.k_layernorm.weight": _copy(f"{a}.k_norm.weight"),
        f"{_M}.self_attention.in_proj.weight": in_proj,
        f"{_M}.self_attention.conv1d.weight": Rule((f"{la}.conv1d.weight",), "gdn_conv1d"),
        f"{_M}.self_attention.A_log": _copy(f"{la}.A_log"),
        f"{_M}.self_attention.dt_bias": _copy(f"{la}.dt_bias"),
        f"{_M}.self_attention.out_norm.weight": _copy(f"{la}.norm.weight"),
        f"{_M}.self_attention.out_proj.weight": _copy(f"{la}.out_proj.weight"),
        f"{_M}.mlp.linear_fc1.weight": _gate_up(mlp),
        f"{_M}.mlp.linear_fc2.weight": _copy(f"{mlp}.down_proj.weight"),
        f"{_M}.mlp.router.weight": _copy(f"{mlp}.gate.weight"),
        f"{_M}.mlp.experts.local_experts.{{expert}}.linear_fc1.weight": _gate_up(f"{mlp}.experts.{{expert}}"),
        f"{_M}.mlp.experts.local_experts.{{expert}}.linear_fc2.weight": _copy(
            f"{mlp}.experts.{{expert}}.down_proj.weight"
        ),
        f"{_M}.mlp.shared_experts.linear_fc1.weight": _gate_up(f"{mlp}.shared_expert"),
        f"{_M}.mlp.shared_experts.linear_fc2.weight": _copy(f"{mlp}.shared_expert.down_proj.weight"),
        f"{_M}.mlp.shared_experts.gate_weight": _copy(f"{mlp}.shared_expert_gate.weight"),
    }


_Q35 = "model.language_model"  # Qwen3.5 checkpoints hold the text model here (beside model.visual and mtp)
_Q35V = "model.visual.blocks.{layer}"
# Qwen3.5's vision tower (transformers' Qwen3_5VisionModel, vision_language.py): Megatron names are the checkpoint's.
_QWEN3_5_VISION = {
    name: _copy(name)
    for name in (
        *(f"model.visual.patch_embed.proj.{p}" for p in ("weight", "bias")),
        "model.visual.pos_embed.weight",
        *(f"{_Q35V}.{m}.{p}" for m in ("norm1", "norm2", "attn.qkv", "attn.proj") for p in ("weight", "bias")),
        *(f"{_Q35V}.mlp.linear_fc{i}.{p}" for i in (1, 2) for p in ("weight", "bias")),
        *(f"model.visual.merger.{m}.{p}" for m in ("norm", "linear_fc1", "linear_fc2") for p in ("weight", "bias")),
    )
}
_QWEN3_5 = {
    **_QWEN3_5_VISION,
    "embedding.word_embeddings.weight": Rule((f"{_Q35}.embed_tokens.weight",), "vocab"),
    "decoder.final_layernorm.weight": _copy(f"{_Q35}.norm.weight"),
    "output_layer.weight": Rule(("lm_head.weight",), "vocab"),
    **_qwen3_next(
        f"{_Q35}.layers.{{layer}}",
        Rule(
            tuple(f"{_Q35}.layers.{{layer}}.linear_attn.in_proj_{p}.weight" for p in ("qkv", "z", "b", "a")),
            "gdn_in_proj_split",
        ),
    ),
}
_QWEN3_NEXT = {
    **_EMBEDDINGS,
    **_qwen3_next(
        _L, Rule((f"{_L}.linear_attn.in_proj_qkvz.weight", f"{_L}.linear_attn.in_proj_ba.weight"), "gdn_in_proj")
    ),
}


# Qwen2.5-VL's vision tower (transformers' module, vision_language.py): Megatron names are the checkpoint's names.
_VB = "visual.blocks.{layer}"
_QWEN2_5_VISION = {
    name: _copy(name)
    for name in (
        "visual.patch_embed.proj.weight",
        f"{_VB}.norm1.weight",
        f"{_VB}.norm2.weight",
        *(f"{_VB}.{module}.{p}" for module in ("attn.qkv", "attn.proj") for p in ("weight", "bias")),
        *(f"{_VB}.mlp.{proj}_proj.{p}" for proj in ("gate", "up", "down") for p in ("weight", "bias")),
        "visual.merger.ln_q.weight",
        *(f"visual.merger.mlp.{i}.{p}" for i in (0, 2) for p in ("weight", "bias")),
    )
}
_VISION_PREFIXES = ("visual.", "model.visual.")


def is_vision_name(key: str) -> bool:
    """Whether a Megatron name (template) is a vision tower's: its blocks keep their own numbering."""
    return key.startswith(_VISION_PREFIXES)


# Qwen3-VL: Qwen3's text model under model.language_model, Qwen3.5's vision tower names plus its deepstack mergers.
_QWEN3_VL = {
    **{
        key: Rule(tuple(n.replace("model.", "model.language_model.", 1) for n in rule.hf), rule.kind)
        for key, rule in {**_DENSE_GQA, **_QK_NORM}.items()
    },
    **_QWEN3_5_VISION,
    **{
        f"model.visual.deepstack_merger_list.{i}.{m}.{p}": _copy(f"model.visual.deepstack_merger_list.{i}.{m}.{p}")
        for i in range(8)
        for m in ("norm", "linear_fc1", "linear_fc2")
        for p in ("weight", "bias")
    },
}

_QVL = "model.language_model.layers.{layer}.mlp"
# Qwen3-VL-MoE: Qwen3-VL's names (dense layers of mlp_only_layers keep them), the router, and routed experts stored
# stacked, one tensor per layer and projection whose expert slices are Megatron's experts (stacked_experts.py).
_QWEN3_VL_MOE = {
    **_QWEN3_VL,
    f"{_M}.mlp.router.weight": _copy(f"{_QVL}.gate.weight"),
    f"{_M}.mlp.experts.local_experts.{{expert}}.linear_fc1.weight": Rule(
        (f"{_QVL}.experts.gate_up_proj",), "expert_gate_up"
    ),
    f"{_M}.mlp.experts.local_experts.{{expert}}.linear_fc2.weight": Rule((f"{_QVL}.experts.down_proj",), "expert_down"),
}

_MBRIDGE = "mbridge.models"
_OURS = "slime_like.trainer.megatron.bridges"
_VL = "slime_like.trainer.megatron.vision_language"


def _families() -> dict[str, Family]:
    return {
        "qwen2": Family(f"{_MBRIDGE}:Qwen2Bridge", _DENSE_GQA),
        "qwen3": Family(f"{_MBRIDGE}:Qwen3Bridge", {**_DENSE_GQA, **_QK_NORM}),
        "llama": Family(f"{_OURS}:Llama3Bridge", _DENSE_GQA),
        # Dense layers (mlp_only_layers) keep the dense MLP names.
        "qwen3_moe": Family(f"{_MBRIDGE}:Qwen3MoEBridge", {**_DENSE_GQA, **_QK_NORM, **_ROUTED_EXPERTS}),
        "deepseek_v3": Family(f"{_OURS}:DeepseekV3CoreBridge", _DEEPSEEK_V3),
        # Kimi-K2: DeepSeek-V3's architecture under its own model_type (its config class is the checkpoint's code).
        "kimi_k2": Family(f"{_OURS}:DeepseekV3CoreBridge", _DEEPSEEK_V3),
        # GLM-4.7-Flash: DeepSeek-V3's architecture; its dense layers are listed in mlp_layer_types.
        "glm4_moe_lite": Family(f"{_OURS}:DeepseekV3CoreBridge", _DEEPSEEK_V3),
        # GLM-5: GLM-4.7-Flash's layers with DeepSeek sparse attention (megatron-core's DSA: slime_like.trainer.megatron.dsa).
        "glm_moe_dsa": Family(f"{_OURS}:GlmMoeDsaBridge", _GLM_MOE_DSA),
        # GLM-4-0414 / GLM-Z1: the sandwich norms are post-norms inside attention and MLP (sandwich_norms.py).
        "glm4": Family(
            f"{_OURS}:Glm4Bridge",
            {
                **_DENSE_GQA,
                f"{_M}.mlp.linear_fc1.weight": Rule((f"{_L}.mlp.gate_up_proj.weight",), "fused_gate_up"),
                f"{_M}.self_attention.post_layernorm.weight": _copy(f"{_L}.post_self_attn_layernorm.weight"),
                f"{_M}.mlp.post_layernorm.weight": _copy(f"{_L}.post_mlp_layernorm.weight"),
            },
        ),
        # GLM-4.5/4.6/4.7: qkv bias and QK norm map when the config has them; dense first_k_dense_replace layers.
        "glm4_moe": Family(f"{_OURS}:Glm4MoeCoreBridge", {**_DENSE_GQA, **_QK_NORM, **_DEEPSEEK_MOE}),
        # MiMo-7B: Qwen2's main layers under their usual names; its MTP layers (model.mtp_layers): mtp.py.
        "mimo": Family(f"{_OURS}:MimoBridge", _DENSE_GQA),
        # MiniMax-M2: every layer MoE (block_sparse_moe, Mixtral's w1/w3/w2 experts), q/k norms over all heads.
        "minimax_m2": Family(f"{_OURS}:MiniMaxM2Bridge", _MINIMAX_M2),
        # Qwen3-Next: gated delta net + gated attention (slime_like.trainer.megatron.gated_delta_net), MoE + shared expert.
        "qwen3_next": Family(f"{_OURS}:Qwen3NextBridge", _QWEN3_NEXT),
        # Qwen2.5-VL: Qwen2's language model (text_config, mrope) beside transformers' vision tower (vision_language.py).
        **dict.fromkeys(
            ("qwen2_5_vl", "qwen2_5_vl_text"),
            Family(f"{_VL}:Qwen2_5VLBridge", {**_DENSE_GQA, **_QWEN2_5_VISION}),
        ),
        # Qwen3-VL (dense): Qwen3's layers under text_config with interleaved mrope, beside transformers' vision tower
        # whose deepstack features enter the first layers (vision_language.py).
        **dict.fromkeys(("qwen3_vl", "qwen3_vl_text"), Family(f"{_VL}:Qwen3VLBridge", _QWEN3_VL)),
        # Qwen3-VL-MoE: Qwen3-MoE's layers in Qwen3-VL's place, its experts stacked in the checkpoint (qwen3_vl_moe.py).
        **dict.fromkeys(
            ("qwen3_vl_moe", "qwen3_vl_moe_text"),
            Family("slime_like.trainer.megatron.qwen3_vl_moe:Qwen3VLMoeBridge", _QWEN3_VL_MOE),
        ),
        # Qwen3.5 / 3.6: Qwen3-Next's layers (in_proj split in four) under text_config, beside transformers' vision
        # tower (vision_language.py); the bridge holds the text config (model_type qwen3_5_text / qwen3_5_moe_text,
        # whose own checkpoints have no tower).
        **dict.fromkeys(("qwen3_5", "qwen3_5_moe"), Family(f"{_VL}:Qwen3_5VLBridge", _QWEN3_5)),
        **dict.fromkeys(("qwen3_5_text", "qwen3_5_moe_text"), Family(f"{_OURS}:Qwen3_5Bridge", _QWEN3_5)),
    }


FAMILIES: dict[str, Family] = _families()

# Transformer Engine spec name -> local spec name (TE fuses norms into the next linear and groups experts).
TE_ALIASES = {
    f"{_M}.self_attention.linear_qkv.layer_norm_weight": f"{_M}.input_layernorm.weight",
    f"{_M}.mlp.linear_fc1.layer_norm_weight": f"{_M}.pre_mlp_layernorm.weight",
    f"{_M}.self_attention.linear_q_up_proj.layer_norm_weight": f"{_M}.self_attention.q_layernorm.weight",
    f"{_M}.self_attention.linear_kv_up_proj.layer_norm_weight": f"{_M}.self_attention.kv_layernorm.weight",
    f"{_M}.self_attention.in_proj.layer_norm_weight": f"{_M}.input_layernorm.weight",  # gated delta net
    f"{_M}.mlp.experts.linear_fc1.weight{{expert}}": f"{_M}.mlp.experts.local_experts.{{expert}}.linear_fc1.weight",
    f"{_M}.mlp.experts.linear_fc2.weight{{expert}}": f"{_M}.mlp.experts.local_experts.{{expert}}.linear_fc2.weight",
}

_LAYER = re.compile(r"(?<=\blayers\.)(\d+)(?=\.)")
_LOCAL_EXPERT = re.compile(r"(?<=\.local_experts\.)(\d+)(?=\.)")
_TE_EXPERT = re.compile(r"(?<=\.experts\.linear_fc[12]\.weight)(\d+)$")
_VISION_BLOCK = re.compile(r"(?<=^visual\.blocks\.)(\d+)(?=\.)|(?<=^model\.visual\.blocks\.)(\d+)(?=\.)")


# Vision-language families whose vision path the trainer does not build yet (vision_language.py builds Qwen2.5-VL's).
VISION_NOT_BUILT = {
    "qwen2_vl": "Qwen2-VL",
    "glm4v": "GLM-4.1V",
    "glm4v_moe": "GLM-4.5V",
}
VISION_BUILT = ("qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe")


def vision_problem(hf_config: Any) -> str | None:
    """Why images cannot train this checkpoint's model (its vision tower is not built), or None if they can."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type in VISION_BUILT:
        return None
    why = "its vision path is not built yet" if model_type in VISION_NOT_BUILT else "it is a text-only model"
    return (
        f"model_type {model_type!r}: {why}; the trainer's vision path is built for {', '.join(VISION_BUILT)}. "
        "Train a Qwen2.5-VL checkpoint on image data, or drop --multimodal-keys to train on text"
    )


def family_of(hf_config: Any) -> Family:
    """The registered family of an HF config, or a ValueError naming its model_type and the known ones."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type in VISION_NOT_BUILT:
        raise ValueError(
            f"model_type {model_type!r} ({VISION_NOT_BUILT[model_type]}) is a vision-language model whose vision path "
            f"is not built yet (the trainer builds {', '.join(VISION_BUILT)}'s: slime_like/trainer/megatron/"
            "vision_language.py)"
        )
    if model_type not in FAMILIES:
        raise ValueError(f"model_type {model_type!r} is not supported; registered families: {sorted(FAMILIES)}")
    return FAMILIES[model_type]


def template(name: str) -> tuple[str, int | None, int | None]:
    """A Megatron name as (local-spec template, layer number, expert number), e.g.
    'decoder.layers.3.mlp.experts.linear_fc1.weight5' -> ('decoder.layers.{layer}.mlp.experts.local_experts.
    {expert}.linear_fc1.weight', 3, 5)."""
    layer = expert = None
    if m := _VISION_BLOCK.search(name):  # a vision tower's block: {layer} is the block number
        return name[: m.start()] + "{layer}" + name[m.end() :], int(m.group(m.lastindex)), None
    if m := _LAYER.search(name):
        layer = int(m.group(1))
        name = name[: m.start()] + "{layer}" + name[m.end() :]
    if m := _LOCAL_EXPERT.search(name) or _TE_EXPERT.search(name):
        expert = int(m.group(1))
        name = name[: m.start()] + "{expert}" + name[m.end() :]
    if name.startswith(_MTP_BLOCK):  # an MTP layer's transformer layer: the decoder layer's aliases
        decoder = name.replace(_MTP_BLOCK, _M + ".", 1)
        return _MTP_BLOCK + TE_ALIASES.get(decoder, decoder)[len(_M) + 1 :], layer, expert
    return TE_ALIASES.get(name, name), layer, expert


_MTP_BLOCK = "mtp.layers.{layer}.transformer_layer."


@dataclass(frozen=True)
class _MTPPlacement:
    """Where a family's HF checkpoint keeps MTP layer {layer}, and the names of its MTP-only tensors."""

    prefix: str  # HF prefix of MTP layer {layer} (a decoder layer's names follow it)
    after_main_layers: bool  # HF layer number = num_hidden_layers + MTP index (DeepSeek) or the index (MiMo)
    own: dict[str, tuple[str, str]]  # Megatron name under mtp.layers.{layer}. -> (HF name under prefix, kind)


_DEEPSEEK_MTP = _MTPPlacement(
    _L,
    True,
    {
        "enorm.weight": ("enorm.weight", "copy"),
        "hnorm.weight": ("hnorm.weight", "copy"),
        "eh_proj.weight": ("eh_proj.weight", "copy"),  # [embedding, hidden], Megatron's order
        "final_layernorm.weight": ("shared_head.norm.weight", "copy"),
    },
)
# Multi-token-prediction layers (megatron-core's mtp.layers.{i}, built with --enable-mtp-training: mtp.py) by family.
MTP_PLACEMENTS: dict[str, _MTPPlacement] = {
    "mimo": _MTPPlacement(
        "model.mtp_layers.{layer}",
        False,
        {
            "enorm.weight": ("token_layernorm.weight", "copy"),
            "hnorm.weight": ("hidden_layernorm.weight", "copy"),
            "eh_proj.weight": ("input_proj.weight", "swap_halves"),  # MiMo concatenates [hidden, embedding]
            "final_layernorm.weight": ("final_layernorm.weight", "copy"),
        },
    ),
    "deepseek_v3": _DEEPSEEK_MTP,
    "kimi_k2": _DEEPSEEK_MTP,
    "glm4_moe_lite": _DEEPSEEK_MTP,
    "glm4_moe": _DEEPSEEK_MTP,
    "glm_moe_dsa": _DEEPSEEK_MTP,
}


def mtp_rules(hf_config: Any, rules: dict[str, Rule]) -> dict[str, Rule]:
    """Megatron -> HF name map of the MTP layers of a family that has them (empty for the others): the MTP-only
    tensors, and the transformer layer under the decoder layer's names at the MTP layer's HF place."""
    place = MTP_PLACEMENTS.get(getattr(hf_config, "model_type", None))
    if place is None:
        return {}
    offset = hf_config.num_hidden_layers if place.after_main_layers else 0
    out = {
        f"mtp.layers.{{layer}}.{name}": Rule((f"{place.prefix}.{hf}",), kind, offset)
        for name, (hf, kind) in place.own.items()
    }
    decoder = _M + "."
    for key, rule in rules.items():
        if key.startswith(decoder):
            hf = tuple(n.replace(_L, place.prefix) for n in rule.hf)
            out[_MTP_BLOCK + key[len(decoder) :]] = Rule(hf, rule.kind, offset)
    return out


def rules_for(hf_config: Any) -> dict[str, Rule]:
    """The family's name map for this config (the output layer reads the embedding when tied), with its
    multi-token-prediction layers' names where the family stores them (mtp_rules)."""
    rules = dict(family_of(hf_config).rules)
    if getattr(hf_config, "tie_word_embeddings", False):
        rules["output_layer.weight"] = Rule(rules["embedding.word_embeddings.weight"].hf, "vocab")
    rules.update(mtp_rules(hf_config, rules))
    return rules
