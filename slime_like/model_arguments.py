"""Megatron architecture flags (as in `scripts/models/*.sh`) and their check against the HF config.

The model itself is built from the HF config through mbridge, so these flags are redundant by
design: launch scripts carry them (as Megatron-LM scripts do) and every one given must agree with
the checkpoint, or the run stops before anything starts, naming the flag and the config field.
"""

from __future__ import annotations

import argparse
from typing import Any

# flag dest -> how to read the same quantity from an HF config
_INT_FIELDS = {
    "num_layers": "num_hidden_layers",
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_attention_heads",
    "num_query_groups": "num_key_value_heads",
    "vocab_size": "vocab_size",
    "num_experts": ("num_experts", "n_routed_experts"),
    "moe_router_topk": ("num_experts_per_tok",),
    "moe_ffn_hidden_size": ("moe_intermediate_size",),
    "q_lora_rank": ("q_lora_rank",),
    "kv_lora_rank": ("kv_lora_rank",),
    "qk_pos_emb_head_dim": ("qk_rope_head_dim",),
    "v_head_dim": ("v_head_dim",),
}


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Architecture flags under Megatron-LM's names; all optional, each checked against the HF config."""
    g = parser.add_argument_group("model architecture (checked against --hf-checkpoint's config.json)")
    for flag in ("num-layers", "hidden-size", "ffn-hidden-size", "num-attention-heads", "num-query-groups",
                 "kv-channels", "vocab-size", "max-position-embeddings", "num-experts", "moe-router-topk",
                 "moe-ffn-hidden-size", "moe-shared-expert-intermediate-size", "q-lora-rank", "kv-lora-rank",
                 "qk-head-dim", "qk-pos-emb-head-dim", "v-head-dim"):  # fmt: skip
        g.add_argument(f"--{flag}", type=int, default=None)
    g.add_argument("--rotary-base", type=float, default=None)
    g.add_argument("--norm-epsilon", type=float, default=None)
    g.add_argument("--normalization", default=None, choices=["RMSNorm", "LayerNorm"])
    g.add_argument("--position-embedding-type", default=None, choices=["rope", "learned_absolute", "none"])
    g.add_argument("--moe-layer-freq", default=None, help="e.g. '[0]*3+[1]*58' or a list; checked for its length")
    for flag in ("swiglu", "disable-bias-linear", "add-qkv-bias", "qk-layernorm", "group-query-attention",
                 "untie-embeddings-and-output-weights", "use-rotary-position-embeddings", "multi-latent-attention"):  # fmt: skip
        g.add_argument(f"--{flag}", action="store_true")
    # Megatron flags that tune kernels or routing, accepted so model files move over unchanged;
    # they change no shape and need no check.
    for flag in ("rotary-percent", "rotary-scaling-factor", "mscale", "mscale-all-dim", "moe-aux-loss-coeff",
                 "moe-router-topk-scaling-factor", "moe-router-bias-update-rate"):  # fmt: skip
        g.add_argument(f"--{flag}", type=float, default=None)
    for flag in ("moe-router-group-topk", "moe-router-num-groups"):
        g.add_argument(f"--{flag}", type=int, default=None)
    for flag in ("moe-router-score-function", "moe-token-dispatcher-type", "moe-token-drop-policy",
                 "moe-router-dtype", "moe-router-load-balancing-type"):  # fmt: skip
        g.add_argument(f"--{flag}", default=None)
    for flag in ("moe-grouped-gemm", "moe-permute-fusion", "moe-router-pre-softmax", "moe-router-enable-expert-bias",
                 "attention-softmax-in-fp32"):  # fmt: skip
        g.add_argument(f"--{flag}", action="store_true")
    # Architecture switches of slime's model files (some from slime's Megatron patch): the HF config and the
    # family registry decide the architecture, so these are accepted as the model's description.
    for flag in ("apply-layernorm-1p", "no-position-embedding", "rotary-interleaved", "use-rope-scaling",
                 "attention-output-gate", "use-gated-attention", "post-self-attn-layernorm", "post-mlp-layernorm",
                 "moe-shared-expert-gate"):  # fmt: skip
        g.add_argument(f"--{flag}", action="store_true")
    g.add_argument("--spec", nargs="*", default=None, help="slime's layer-spec module: the family registry's here")


def _hf(config: Any, names: str | tuple[str, ...]) -> Any:
    for name in (names,) if isinstance(names, str) else names:
        value = getattr(config, name, None)
        if value is not None:
            return name, value
    return (names if isinstance(names, str) else names[0]), None


def _rope_theta(config: Any) -> float | None:
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta")
    return theta


def expected_from_hf(config: Any) -> dict[str, tuple[str, Any]]:
    """For each checkable flag dest: (HF field name, the value the flag must have)."""
    out: dict[str, tuple[str, Any]] = {}
    for dest, names in _INT_FIELDS.items():
        field, value = _hf(config, names)
        if value is not None:
            out[dest] = (field, value)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    mla = getattr(config, "kv_lora_rank", None) is not None
    if not mla:
        out["kv_channels"] = ("head_dim", head_dim)
    else:
        out["qk_head_dim"] = ("qk_nope_head_dim", config.qk_nope_head_dim)
    out["ffn_hidden_size"] = ("intermediate_size", config.intermediate_size)
    out["untie_embeddings_and_output_weights"] = (
        "tie_word_embeddings",
        not getattr(config, "tie_word_embeddings", False),
    )
    out["multi_latent_attention"] = ("kv_lora_rank", mla)
    out["add_qkv_bias"] = (
        "attention_bias / model_type",
        bool(getattr(config, "attention_bias", False)) or config.model_type == "qwen2",
    )
    out["norm_epsilon"] = ("rms_norm_eps", getattr(config, "rms_norm_eps", None))
    if _rope_theta(config) is not None:
        out["rotary_base"] = ("rope_theta", _rope_theta(config))
    if "max_position_embeddings" in config.to_dict():
        out["max_position_embeddings"] = ("max_position_embeddings", config.max_position_embeddings)
    shared = getattr(config, "moe_shared_expert_intermediate_size", None) or (
        getattr(config, "n_shared_experts", 0) or 0
    ) * (getattr(config, "moe_intermediate_size", 0) or 0)
    if shared:
        out["moe_shared_expert_intermediate_size"] = ("n_shared_experts x moe_intermediate_size", shared)
    return out


def check_against_hf_config(args: argparse.Namespace, config: Any) -> list[str]:
    """One message per architecture flag that contradicts the HF config (empty: all agree)."""
    problems = []
    # A missing on/off flag only counts when the script declares the architecture at all.
    declared = args.num_layers is not None or args.hidden_size is not None
    for dest, (field, want) in expected_from_hf(config).items():
        given = getattr(args, dest, None)
        if given is None or want is None:
            continue
        if isinstance(given, bool):
            if given and not want:  # store_true flags: only a flag that is present can contradict
                problems.append(f"--{dest.replace('_', '-')} is set but the HF config has {field}={_show(field, want)}")
            if (
                declared
                and not given
                and want
                and dest in ("untie_embeddings_and_output_weights", "multi_latent_attention")
            ):
                problems.append(
                    f"--{dest.replace('_', '-')} is missing but the HF config has {field}={_show(field, want)}"
                )
            continue
        if isinstance(given, float) and abs(given - float(want)) <= 1e-9 * max(1.0, abs(float(want))):
            continue
        if given != want:
            problems.append(f"--{dest.replace('_', '-')} {given} contradicts {field}={want} in the HF config")
    model_name = getattr(args, "model_name", None)
    if model_name and not model_name_matches(model_name, config.model_type):
        problems.append(
            f"--model-name {model_name} names another model than the HF config's model_type {config.model_type!r}, "
            "which picks the Megatron -> HF conversion here (drop --model-name or fix it)"
        )
    if args.moe_layer_freq and isinstance(args.moe_layer_freq, str):
        layers = _moe_layer_pattern(args.moe_layer_freq)
        if layers is not None and len(layers) != config.num_hidden_layers:
            problems.append(
                f"--moe-layer-freq has {len(layers)} entries but the HF config has num_hidden_layers={config.num_hidden_layers}"
            )
    return problems


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


def _moe_layer_pattern(text: str) -> list[int] | None:
    """Megatron's --moe-layer-freq as a list ('[1]*48', '[0]*3+[1]*58', '[0, 1, 1]'), or None if an int."""
    text = text.strip().strip("'\"")
    if text.isdigit():
        return None
    try:
        value = eval(text, {"__builtins__": {}}, {})  # noqa: S307 - list arithmetic only, no names
    except Exception as exc:
        raise ValueError(f"--moe-layer-freq {text!r} is not a list expression like '[0]*3+[1]*58'") from exc
    return list(value)
