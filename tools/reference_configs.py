"""HF config.json files of the models the launch scripts target, for dry runs without the weights.

Example: python tools/reference_configs.py --model glm4.7-flash --out /tmp/glm4.7-flash

Two kinds of entries:
- PUBLISHED: the config.json of a model's Hugging Face checkpoint, field for field, kept as data in
  tools/hf_configs/<model>.json. Where the checkpoint's config names custom code (`auto_map`, e.g. Kimi-K2's
  "kimi_k2" or MiMo's "mimo", which transformers does not know), the writer also writes that config module in the
  shape the checkpoint ships it (CUSTOM_CONFIG_MODULES: DeepSeek-V3's and MiniMax-M2's are standalone
  PretrainedConfig classes written for transformers 4, MiMo's a Qwen2Config subclass), as our own code storing the
  same fields: the checkpoint then loads only with trust_remote_code=True, and reads as the real one does.
- BUILT: the Qwen3 / Llama 3 / DeepSeek-V3 sizes, built with transformers' config class (as save_pretrained
  writes them).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

HF_CONFIGS = Path(__file__).resolve().parent / "hf_configs"

# model -> where its config.json comes from (every field name is that of the published file).
PUBLISHED: dict[str, str] = {
    "glm4.7-flash": "zai-org/GLM-4.7-Flash (glm4_moe_lite; slime's scripts/models/glm4.7-30B-A3B.sh)",
    "glm4.5-355B-A32B": "zai-org/GLM-4.5 (glm4_moe)",
    # GLM-4.6 and GLM-4.7 keep GLM-4.5's architecture; their context grows to 202752 positions.
    "glm4.7-355B-A32B": "zai-org/GLM-4.7 (glm4_moe; GLM-4.6 has the same architecture)",
    "glm4.5-106B-A12B": "zai-org/GLM-4.5-Air (glm4_moe)",
    "glm4-9B": "zai-org/GLM-4-9B-0414 (glm4)",
    # GLM-5 ships in transformers 5's format: rope_parameters, not rope_theta / rope_scaling. The sizes agree with
    # slime's scripts/models/glm5-744B-A40B.sh.
    "glm5-744B-A40B": "zai-org/GLM-5 (glm_moe_dsa)",
    "kimi-k2": "moonshotai/Kimi-K2-Instruct (kimi_k2, custom code: configuration_deepseek.DeepseekV3Config)",
    # The Instruct checkpoint, which slime's Moonlight scripts load.
    "moonlight": (
        "moonshotai/Moonlight-16B-A3B-Instruct (deepseek_v3, custom code: configuration_deepseek.DeepseekV3Config)"
    ),
    "mimo-7B-rl": "XiaomiMiMo/MiMo-7B-RL (mimo, custom code: configuration_mimo.MiMoConfig, a Qwen2 config)",
    # The FP8 checkpoint with its remote-code config (before the repository moved to transformers 5's format).
    "minimax-m2": "MiniMaxAI/MiniMax-M2 (minimax_m2, custom code: configuration_minimax_m2.MiniMaxM2Config)",
    "qwen3-next-80B-A3B": "Qwen/Qwen3-Next-80B-A3B-Instruct (qwen3_next)",
    # Qwen3.5 nests the language model under text_config; the number of linear-attention value heads (16 / 32 / 48)
    # and the vision tower (12, 24 or 27 blocks) differ between sizes.
    "qwen3.5-0.8B": "Qwen/Qwen3.5-0.8B (qwen3_5)",
    "qwen3.5-4B": "Qwen/Qwen3.5-4B (qwen3_5)",
    "qwen3.5-9B": "Qwen/Qwen3.5-9B (qwen3_5)",
    "qwen3.5-27B": "Qwen/Qwen3.5-27B (qwen3_5)",
    "qwen3.5-35B-A3B": "Qwen/Qwen3.5-35B-A3B (qwen3_5_moe)",
}

# Config modules that published checkpoints ship (auto_map -> AutoConfig), as their checkpoints have them: the class,
# what it derives from, and the fields its __init__ stores with their defaults. DeepSeek-V3's configuration_deepseek.py
# (Kimi-K2 and Moonlight ship it too) and MiniMax-M2's configuration_minimax_m2.py are standalone PretrainedConfig
# classes written for transformers 4: no attribute_map, DeepSeek's n_routed_experts / MiniMax's num_local_experts,
# rope_theta and rope_scaling at the top level. MiMo's derives from Qwen2Config and adds num_nextn_predict_layers.
# Each is written as our own short module storing the same fields, so the readers see what a real checkpoint gives.
_DEEPSEEK_V3_FIELDS: dict[str, Any] = dict(
    vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=61,
    num_nextn_predict_layers=1, num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1,
    n_routed_experts=256, ep_size=1, routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=1536,
    qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, topk_method="noaux_tc", n_group=8, topk_group=4,
    num_experts_per_tok=8, moe_layer_freq=1, first_k_dense_replace=3, norm_topk_prob=True, scoring_func="sigmoid",
    hidden_act="silu", max_position_embeddings=4096, initializer_range=0.02, rms_norm_eps=1e-6, use_cache=True,
    rope_theta=10000.0, rope_scaling=None, attention_bias=False, attention_dropout=0.0,
)  # fmt: skip
# MiniMax-M2's module keeps Mixtral's fields; its own (rotary_dim, use_qk_norm, scoring_func, ...) arrive as extra
# config.json keys, which PretrainedConfig sets as attributes.
_MINIMAX_M2_FIELDS: dict[str, Any] = dict(
    vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=8, head_dim=None, hidden_act="silu", max_position_embeddings=4096 * 32,
    initializer_range=0.02, rms_norm_eps=1e-5, use_cache=True, rope_theta=1e6, sliding_window=None,
    attention_dropout=0.0, num_experts_per_tok=2, num_local_experts=8, output_router_logits=False,
    router_aux_loss_coef=0.001, router_jitter_noise=0.0,
)  # fmt: skip
# auto_map's AutoConfig -> (base class, stored fields and defaults, token ids and tying given to the base's __init__)
CUSTOM_CONFIG_MODULES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "configuration_deepseek.DeepseekV3Config": (
        "PretrainedConfig",
        _DEEPSEEK_V3_FIELDS,
        dict(pad_token_id=None, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False),
    ),
    "configuration_minimax_m2.MiniMaxM2Config": (
        "PretrainedConfig",
        _MINIMAX_M2_FIELDS,
        dict(pad_token_id=None, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False),
    ),
    "configuration_mimo.MiMoConfig": ("Qwen2Config", dict(num_nextn_predict_layers=0), {}),
}

_QWEN3 = dict(head_dim=128, rms_norm_eps=1e-6, rope_theta=1_000_000.0, vocab_size=151936, max_position_embeddings=40960)
BUILT: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3-0.6B": ("Qwen3Config", dict(_QWEN3, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                       num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True)),
    "qwen3-4B": ("Qwen3Config", dict(_QWEN3, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True)),
    "qwen3-8B": ("Qwen3Config", dict(_QWEN3, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False)),
    "qwen3-30B-A3B": ("Qwen3MoeConfig", dict(_QWEN3, hidden_size=2048, intermediate_size=6144, num_hidden_layers=48,
                                             num_attention_heads=32, num_key_value_heads=4, num_experts=128,
                                             num_experts_per_tok=8, moe_intermediate_size=768, decoder_sparse_step=1,
                                             mlp_only_layers=[], norm_topk_prob=True, tie_word_embeddings=False)),
    "llama3-8B": ("LlamaConfig", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5,
                                      rope_theta=500_000.0, vocab_size=128256, max_position_embeddings=8192,
                                      tie_word_embeddings=False)),
    "deepseek-v3": ("DeepseekV3Config", dict(hidden_size=7168, intermediate_size=18432, num_hidden_layers=61,
                                             num_attention_heads=128, num_key_value_heads=128, n_routed_experts=256,
                                             n_shared_experts=1, num_experts_per_tok=8, moe_intermediate_size=2048,
                                             first_k_dense_replace=3, q_lora_rank=1536, kv_lora_rank=512,
                                             qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                                             vocab_size=129280, rms_norm_eps=1e-6, max_position_embeddings=163840,
                                             routed_scaling_factor=2.5, tie_word_embeddings=False)),
}  # fmt: skip

REFERENCE_CONFIGS: list[str] = sorted([*PUBLISHED, *BUILT])


def published_config(model: str) -> dict[str, Any]:
    """The published config.json of `model` as a dict."""
    return json.loads((HF_CONFIGS / f"{model}.json").read_text())


def custom_config_module(auto_config: str, model_type: str) -> str:
    """Source of the config module a checkpoint's auto_map names, under the checkpoint's model_type."""
    class_name = auto_config.rsplit(".", 1)[1]
    base, fields, passed = CUSTOM_CONFIG_MODULES[auto_config]
    params = [f"        {name}={value!r}," for name, value in {**fields, **passed}.items()]
    stores = [f"        self.{name} = {name}" for name in fields]
    # A Qwen2Config subclass hands every Qwen2 field to its base; a standalone class only the token ids and tying.
    forward = ", ".join(f"{name}={name}" for name in passed)
    lines = [
        f'"""{class_name} as the checkpoint ships it (written by slime-like\'s tools/reference_configs.py)."""',
        "",
        f"from transformers import {base}",
        "",
        "",
        f"class {class_name}({base}):",
        f"    model_type = {model_type!r}",
        '    keys_to_ignore_at_inference = ["past_key_values"]',
        "",
        "    def __init__(",
        "        self,",
        *params,
        "        **kwargs,",
        "    ):",
        *stores,
        f"        super().__init__({forward + ', ' if forward else ''}**kwargs)",
        "",
    ]
    return "\n".join(lines)


def write_reference_config(model: str, out: str | Path) -> Path:
    """Write `model`'s config.json (and any custom config module its auto_map names) into `out` (created)."""
    if model not in REFERENCE_CONFIGS:
        raise SystemExit(f"--model {model!r} is not known; choose one of {REFERENCE_CONFIGS}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if model in BUILT:
        import transformers

        class_name, fields = BUILT[model]
        fields = dict(fields)
        theta = fields.pop("rope_theta", 10000.0)
        rope = {"rope_type": "default", "rope_theta": theta}
        getattr(transformers, class_name)(rope_parameters=rope, **fields).save_pretrained(out)
        return out
    config = published_config(model)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    auto_config = (config.get("auto_map") or {}).get("AutoConfig")
    if auto_config:
        module = auto_config.rsplit(".", 1)[0]
        (out / f"{module}.py").write_text(custom_config_module(auto_config, config["model_type"]))
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, choices=REFERENCE_CONFIGS)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    print(write_reference_config(a.model, a.out))
