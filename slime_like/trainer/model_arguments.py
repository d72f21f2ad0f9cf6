"""Megatron architecture flags (as in `scripts/models/*.sh`) and their check against the HF config.

The model itself is built from the HF config through mbridge, so these flags are redundant by
design: launch scripts carry them (as Megatron-LM scripts do) and every one given must agree with
the checkpoint, or the run stops before anything starts, naming the flag and the config field.
"""

from __future__ import annotations

import argparse
from typing import Any

from slime_like.core.hf_config import hf_field, hf_field_named, rope_parameters, text_config

# flag dest -> the HF config field (slime_like.core.hf_config.FIELD_NAMES knows each field's published names)
_INT_FIELDS: dict[str, str] = {
    "num_layers": "num_hidden_layers",
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_attention_heads",
    "num_query_groups": "num_key_value_heads",
    "vocab_size": "vocab_size",
    "padded_vocab_size": "vocab_size",  # slime sets the model's vocabulary with it; the engine uses the HF one
    "num_experts": "num_experts",
    "moe_router_topk": "num_experts_per_tok",
    "moe_ffn_hidden_size": "moe_intermediate_size",
    "q_lora_rank": "q_lora_rank",
    "kv_lora_rank": "kv_lora_rank",
    "qk_pos_emb_head_dim": "qk_rope_head_dim",
    "v_head_dim": "v_head_dim",
    "moe_router_topk_scaling_factor": "routed_scaling_factor",
    "moe_router_num_groups": "n_group",
    "moe_router_group_topk": "topk_group",
    "moe_router_score_function": "scoring_func",
    "mtp_num_layers": "mtp_num_layers",  # the MTP layers the checkpoint carries
}

# Families whose attention has q/k norms or q/k/v biases without saying so in a config field (GQA attention;
# multi-latent attention has neither flag's meaning).
_QK_NORM_TYPES = (
    *("qwen3", "qwen3_moe", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"),
    *("qwen3_vl_text", "qwen3_vl_moe_text"),  # Qwen3-VL(-MoE)'s text models: Qwen3's attention
)
_NO_QK_NORM_TYPES = ("llama", "qwen2", "mimo", "glm4")
_QKV_BIAS_TYPES = ("qwen2", "mimo")  # Qwen2's attention (MiMo's too) always has q/k/v biases

# Flags that must be present (not only not contradicted) once a script declares the architecture at all.
_REQUIRED_SWITCHES = ("untie_embeddings_and_output_weights", "multi_latent_attention", "qk_layernorm", "add_qkv_bias")

# Accepted so slime's model files move over unchanged, and not checked against the HF config: kernel and
# dispatch choices, router-training settings (how routing learns, not the checkpoint's shapes), and layer-spec
# switches that the HF config and the family registry decide here.
UNCHECKED_MODEL_FLAGS = (
    "--moe-grouped-gemm", "--moe-permute-fusion", "--moe-token-dispatcher-type", "--moe-token-drop-policy",
    "--moe-router-dtype", "--attention-softmax-in-fp32", "--moe-aux-loss-coeff", "--moe-router-bias-update-rate",
    "--moe-router-load-balancing-type", "--moe-router-pre-softmax", "--moe-router-enable-expert-bias",
    "--group-query-attention", "--use-rotary-position-embeddings", "--position-embedding-type", "--normalization",
    "--swiglu", "--disable-bias-linear", "--apply-layernorm-1p", "--no-position-embedding", "--rotary-interleaved",
    "--use-rope-scaling", "--attention-output-gate", "--use-gated-attention", "--post-self-attn-layernorm",
    "--post-mlp-layernorm", "--moe-shared-expert-gate", "--spec",
)  # fmt: skip


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Architecture flags under Megatron-LM's names; all optional, each checked against the HF config."""
    g = parser.add_argument_group("model architecture (checked against --hf-checkpoint's config.json)")
    for flag in ("num-layers", "hidden-size", "ffn-hidden-size", "num-attention-heads", "num-query-groups",
                 "kv-channels", "vocab-size", "padded-vocab-size", "max-position-embeddings", "num-experts", "moe-router-topk",
                 "moe-ffn-hidden-size", "moe-shared-expert-intermediate-size", "q-lora-rank", "kv-lora-rank",
                 "qk-head-dim", "qk-pos-emb-head-dim", "v-head-dim", "moe-router-group-topk",
                 "moe-router-num-groups"):  # fmt: skip
        g.add_argument(f"--{flag}", type=int, default=None)
    g.add_argument("--rotary-base", type=float, default=None)
    g.add_argument("--rotary-percent", type=float, default=None, help="checked against partial_rotary_factor")
    g.add_argument(
        "--rotary-scaling-factor", type=float, default=None, help="MLA: checked against the YaRN rope factor"
    )
    g.add_argument("--mscale", type=float, default=None, help="MLA: checked against the YaRN rope mscale")
    g.add_argument("--mscale-all-dim", type=float, default=None, help="MLA: checked against YaRN's mscale_all_dim")
    g.add_argument(
        "--moe-router-topk-scaling-factor", type=float, default=None, help="checked against routed_scaling_factor"
    )
    g.add_argument("--moe-router-score-function", default=None, help="checked against scoring_func where given")
    g.add_argument("--norm-epsilon", type=float, default=None)
    g.add_argument("--normalization", default=None, choices=["RMSNorm", "LayerNorm"])
    g.add_argument("--position-embedding-type", default=None, choices=["rope", "learned_absolute", "none"])
    g.add_argument(
        "--moe-layer-freq",
        default=None,
        help="e.g. '[0]*3+[1]*58', a list or an int; checked against the HF config's dense and MoE layers",
    )
    for flag in ("swiglu", "disable-bias-linear", "add-qkv-bias", "qk-layernorm", "group-query-attention",
                 "untie-embeddings-and-output-weights", "use-rotary-position-embeddings", "multi-latent-attention"):  # fmt: skip
        g.add_argument(f"--{flag}", action="store_true")
    # See UNCHECKED_MODEL_FLAGS: accepted as the model's description, no check.
    g.add_argument("--moe-aux-loss-coeff", type=float, default=None)
    g.add_argument("--moe-router-bias-update-rate", type=float, default=None)
    for flag in ("moe-token-dispatcher-type", "moe-token-drop-policy", "moe-router-dtype",
                 "moe-router-load-balancing-type"):  # fmt: skip
        g.add_argument(f"--{flag}", default=None)
    for flag in ("moe-grouped-gemm", "moe-permute-fusion", "moe-router-pre-softmax", "moe-router-enable-expert-bias",
                 "attention-softmax-in-fp32", "apply-layernorm-1p", "no-position-embedding", "rotary-interleaved",
                 "use-rope-scaling", "attention-output-gate", "use-gated-attention", "post-self-attn-layernorm",
                 "post-mlp-layernorm", "moe-shared-expert-gate"):  # fmt: skip
        g.add_argument(f"--{flag}", action="store_true")
    g.add_argument("--spec", nargs="*", default=None, help="slime's layer-spec module: the family registry's here")


def read_hf_config(path: str) -> Any:
    """The checkpoint's transformers config, read as slime reads it (custom code in the checkpoint allowed).

    Kimi-K2's or MiMo's config.json names its own config class (auto_map): like slime and SGLang, it is
    loaded with trust_remote_code=True. The checkpoint need not hold weights.
    """
    from slime_like.core.hf_config import load_hf_config

    try:
        return load_hf_config(path)
    except (ValueError, KeyError, ImportError) as exc:  # an unknown model_type, or custom code that does not load
        raise ValueError(f"--hf-checkpoint {path}: transformers cannot read its config.json ({exc})") from exc


def _partial_rotary(config: Any) -> tuple[str, float]:
    """Fraction of each head that RoPE rotates (1.0 unless the config says otherwise)."""
    factor = rope_parameters(config).get("partial_rotary_factor")
    if factor is not None:
        return "partial_rotary_factor", factor
    rotary_dim, head_dim = hf_field(config, "rotary_dim"), hf_field(config, "head_dim")
    if rotary_dim and head_dim:  # MiniMax-M2 gives the rotated dimensions
        return "rotary_dim / head_dim", rotary_dim / head_dim
    return "partial_rotary_factor", 1.0


def moe_layer_pattern(config: Any) -> tuple[str, list[int]] | None:
    """(field, 0/1 per layer: 1 = MoE) as the HF config places its MoE layers; None for a dense model."""
    layers = hf_field(config, "num_hidden_layers")
    if not hf_field(config, "num_experts"):
        return None
    types = hf_field(config, "mlp_layer_types")
    if types:
        return "mlp_layer_types", [0 if kind == "dense" else 1 for kind in types]
    first_dense = hf_field(config, "first_k_dense_replace")
    if first_dense is not None:
        # DeepSeek's code makes layer i MoE from first_k_dense_replace on where i % moe_layer_freq == 0.
        freq = hf_field(config, "moe_layer_freq", 1)
        return "first_k_dense_replace", [int(i >= first_dense and i % freq == 0) for i in range(layers)]
    step = hf_field(config, "decoder_sparse_step") or 1
    dense = set(hf_field(config, "mlp_only_layers") or [])
    return "decoder_sparse_step / mlp_only_layers", [int(i not in dense and (i + 1) % step == 0) for i in range(layers)]


def expert_width(config: Any) -> tuple[str, int | None]:
    """(field, intermediate size of one routed expert); MiniMax-M2 and Mixtral size experts with intermediate_size."""
    field, width = hf_field_named(config, "moe_intermediate_size")
    if width is None and hf_field(config, "num_experts"):
        return hf_field_named(config, "intermediate_size")
    return field, width


def shared_expert_width(config: Any) -> tuple[str, int]:
    """(field, intermediate size of a MoE layer's shared experts together); 0 without shared experts."""
    field, width = hf_field_named(config, "shared_expert_intermediate_size")
    if not width and hf_field(config, "n_shared_experts"):  # DeepSeek: n_shared_experts experts of the routed width
        return "n_shared_experts x moe_intermediate_size", hf_field(config, "n_shared_experts") * (
            hf_field(config, "moe_intermediate_size") or 0
        )
    return field, width or 0


def expected_from_hf(config: Any) -> dict[str, tuple[str, Any]]:
    """For each checkable flag dest: (HF field name, the value the flag must have); `config` outer or nested."""
    out: dict[str, tuple[str, Any]] = {}
    for dest, field in _INT_FIELDS.items():
        name, value = hf_field_named(config, field)
        if value is not None:
            out[dest] = (name, value)
    heads = hf_field(config, "num_attention_heads")
    head_dim = hf_field(config, "head_dim") or hf_field(config, "hidden_size") // heads
    mla = hf_field(config, "kv_lora_rank") is not None
    model_type = text_config(config).model_type
    pattern = moe_layer_pattern(config)
    rope = rope_parameters(config)
    if not mla:
        out["kv_channels"] = ("head_dim", head_dim)
        out["add_qkv_bias"] = (
            "attention_bias / model_type",
            bool(hf_field(config, "attention_bias", False)) or model_type in _QKV_BIAS_TYPES,
        )
        if hf_field(config, "use_qk_norm") is not None:
            out["qk_layernorm"] = ("use_qk_norm", bool(hf_field(config, "use_qk_norm")))
        elif model_type in _QK_NORM_TYPES + _NO_QK_NORM_TYPES:
            out["qk_layernorm"] = (f"model_type {model_type!r}", model_type in _QK_NORM_TYPES)
    else:
        out["qk_head_dim"] = ("qk_nope_head_dim", hf_field(config, "qk_nope_head_dim"))
        # Megatron's MLA applies YaRN from these flags; without YaRN in the config the factor is 1.
        yarn = rope.get("rope_type", rope.get("type")) == "yarn"
        out["rotary_scaling_factor"] = ("rope_scaling.factor", rope.get("factor", 1.0) if yarn else 1.0)
        if yarn:
            out["mscale"] = ("rope_scaling.mscale", rope.get("mscale", 1.0))
            out["mscale_all_dim"] = ("rope_scaling.mscale_all_dim", rope.get("mscale_all_dim", 0.0))
    intermediate = hf_field(config, "intermediate_size")
    # As slime: --ffn-hidden-size sizes only dense MLPs, so a model that is MoE in every layer leaves it unchecked.
    if intermediate is not None and (pattern is None or 0 in pattern[1]):
        out["ffn_hidden_size"] = ("intermediate_size", intermediate)
    if pattern is not None and expert_width(config)[1]:
        out["moe_ffn_hidden_size"] = expert_width(config)
    out["untie_embeddings_and_output_weights"] = (
        "tie_word_embeddings",
        not hf_field(config, "tie_word_embeddings", False),
    )
    out["multi_latent_attention"] = ("kv_lora_rank", mla)
    out["norm_epsilon"] = ("rms_norm_eps", hf_field(config, "rms_norm_eps"))
    if rope.get("rope_theta") is not None:
        out["rotary_base"] = ("rope_theta", rope["rope_theta"])
    out["rotary_percent"] = _partial_rotary(config)
    if "max_position_embeddings" in text_config(config).to_dict():
        out["max_position_embeddings"] = ("max_position_embeddings", hf_field(config, "max_position_embeddings"))
    shared_field, shared = shared_expert_width(config)
    if shared:
        out["moe_shared_expert_intermediate_size"] = (shared_field, shared)
    return out


def check_against_hf_config(args: argparse.Namespace, config: Any) -> list[str]:
    """One message per architecture flag that contradicts the HF config (empty: all agree)."""
    problems = []
    # A missing on/off flag only counts when the script declares the architecture at all.
    declared = args.num_layers is not None or args.hidden_size is not None
    for dest, (field, want) in expected_from_hf(config).items():
        given = getattr(args, dest, None)
        flag = f"--{dest.replace('_', '-')}"
        if given is None or want is None:
            continue
        if isinstance(given, bool):
            if given and not want:  # store_true flags: only a flag that is present can contradict
                problems.append(f"{flag} is set but the HF config has {field}={_show(field, want)}")
            if declared and not given and want and dest in _REQUIRED_SWITCHES:
                problems.append(f"{flag} is missing but the HF config has {field}={_show(field, want)}")
            continue
        if isinstance(given, float) and abs(given - float(want)) <= 1e-6 * max(1.0, abs(float(want))):
            continue
        if given != want:
            problems.append(f"{flag} {given} contradicts {field}={want} in the HF config")
    model_name = getattr(args, "model_name", None)
    if model_name and not model_name_matches(model_name, config.model_type):
        problems.append(
            f"--model-name {model_name} names another model than the HF config's model_type {config.model_type!r}, "
            "which picks the Megatron -> HF conversion here (drop --model-name or fix it)"
        )
    if args.moe_layer_freq:
        problems += _check_moe_layer_freq(args.moe_layer_freq, config)
    return problems


def _check_moe_layer_freq(value: str, config: Any) -> list[str]:
    """--moe-layer-freq against the layers the HF config makes dense and MoE."""
    layers = hf_field(config, "num_hidden_layers")
    given = moe_layer_freq_pattern(value, layers)
    if len(given) != layers:
        return [f"--moe-layer-freq has {len(given)} entries but the HF config has num_hidden_layers={layers}"]
    expected = moe_layer_pattern(config)
    if expected is None:
        return [] if not any(given) else [f"--moe-layer-freq {value} places MoE layers in a model without experts"]
    field, want = expected
    if given == want:
        return []
    dense = [i for i, moe in enumerate(given) if not moe]
    want_dense = [i for i, moe in enumerate(want) if not moe]
    return [f"--moe-layer-freq {value} makes layers {dense} dense but the HF config ({field}) makes {want_dense} dense"]


def model_name_matches(model_name: str, model_type: str) -> bool:
    """Whether slime's --model-name (e.g. qwen3, Qwen3MoeConfig, qwen3-4b) names the HF config's model_type.

    slime picks its converter by the lower-cased name (default: the config class name); here the name must
    start with the model_type, separators and a trailing "config" aside, and not go on to a MoE variant.
    """

    def norm(text: str) -> str:
        return text.lower().replace("_", "").replace("-", "").replace(".", "").removesuffix("config")

    name, kind = norm(model_name), norm(model_type)
    return name.startswith(kind) and not (name[len(kind) :].startswith("moe") and "moe" not in kind)


def _show(field: str, want: Any) -> Any:
    # The flag is the negation of tie_word_embeddings: show the config's own value.
    return (not want) if field == "tie_word_embeddings" else want


def moe_layer_freq_pattern(text: str, num_layers: int) -> list[int]:
    """Megatron's --moe-layer-freq as 0/1 per layer: a list expression ('[1]*48', '[0]*3+[1]*58', '[0,1,1]') or an
    int N (every N-th layer is MoE, from layer 0)."""
    text = str(text).strip().strip("'\"")
    if text.isdigit():
        return [int(i % int(text) == 0) for i in range(num_layers)]
    try:
        value = eval(text, {"__builtins__": {}}, {})  # noqa: S307 - list arithmetic only, no names
        return [int(x) for x in value]
    except Exception as exc:
        raise ValueError(f"--moe-layer-freq {text!r} is not an int or a list expression like '[0]*3+[1]*58'") from exc
