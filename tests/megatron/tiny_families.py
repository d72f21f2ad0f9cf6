"""Tiny checkpoints of the families tools/make_tiny_model.py does not make: Llama 3 (rope scaling) and
DeepSeek-V3 (MLA, shared experts, expert bias, a dense first layer), with the tiny Qwen3's tokenizer."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def _save(model, out: Path, tokenizer_from: Path) -> Path:
    model.save_pretrained(out)
    for name in _TOKENIZER_FILES:
        if (tokenizer_from / name).exists():
            shutil.copy(tokenizer_from / name, out / name)
    return out


def make_llama3(out: Path, tokenizer_from: Path) -> Path:
    """Llama with Llama 3's "llama3" rope scaling and untied embeddings."""
    import transformers

    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}  # fmt: skip
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=2048, rms_norm_eps=1e-5,
        tie_word_embeddings=False, rope_parameters=rope, eos_token_id=2, pad_token_id=3, bos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    return _save(transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32), out, tokenizer_from)


def make_deepseek_v3(out: Path, tokenizer_from: Path) -> Path:
    """DeepSeek-V3-style: MLA with q LoRA, 4 routed experts (top-2, two groups) + 1 shared, 4 layers."""
    import transformers

    config = transformers.DeepseekV3Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1,
        num_experts_per_tok=2, first_k_dense_replace=1, n_group=2, topk_group=1, q_lora_rank=32, kv_lora_rank=16,
        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, max_position_embeddings=2048, rms_norm_eps=1e-6,
        tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        eos_token_id=2, pad_token_id=3, bos_token_id=2,
        num_nextn_predict_layers=0,  # transformers >= 5.17 declares 1 by default, and saves no MTP layer
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # a non-zero expert bias, so that routing depends on it
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(torch.randn(buffer.shape, generator=torch.Generator().manual_seed(1)) * 0.1)
    return _save(model, out, tokenizer_from)


def _random_expert_bias(model) -> None:
    """A non-zero expert bias, so that routing depends on it."""
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(torch.randn(buffer.shape, generator=torch.Generator().manual_seed(1)) * 0.1)


def _add_mtp_layer(out: Path, config_updates: dict) -> None:
    """Turn a checkpoint saved with one layer too many into one whose last layer is a multi-token-prediction
    layer, stored as GLM-4.5 and DeepSeek-V3 store it: a decoder layer plus enorm, hnorm, eh_proj and
    shared_head.norm under model.layers.{num_hidden_layers}, with num_nextn_predict_layers=1."""
    import json

    from safetensors.torch import load_file, save_file

    config = json.loads((out / "config.json").read_text())
    mtp, hidden = config["num_hidden_layers"] - 1, config["hidden_size"]
    g = torch.Generator().manual_seed(2)
    tensors = load_file(out / "model.safetensors")
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        tensors[f"model.layers.{mtp}.{norm}.weight"] = 1 + 0.1 * torch.randn(hidden, generator=g)
    tensors[f"model.layers.{mtp}.eh_proj.weight"] = 0.02 * torch.randn(hidden, 2 * hidden, generator=g)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    config.update(num_hidden_layers=mtp, num_nextn_predict_layers=1, **config_updates)
    (out / "config.json").write_text(json.dumps(config, indent=2))


def make_glm4_moe(out: Path, tokenizer_from: Path) -> Path:
    """GLM-4.5-style: GQA with qkv bias and QK norm, half-rotary rope, 4 routed experts (top-2 of two groups)
    + 2 shared, a dense first layer, routed_scaling_factor 2.5, and one multi-token-prediction layer."""
    import transformers

    config = transformers.Glm4MoeConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=5,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, n_routed_experts=4, n_shared_experts=2,
        num_experts_per_tok=2, first_k_dense_replace=1, n_group=2, topk_group=1, routed_scaling_factor=2.5,
        norm_topk_prob=True, attention_bias=True, use_qk_norm=True, max_position_embeddings=2048,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        eos_token_id=2, pad_token_id=3, bos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _random_expert_bias(model)
    _save(model, out, tokenizer_from)
    _add_mtp_layer(out, {})  # the 5th layer becomes the MTP layer: 4 main layers (PP2 splits them)
    return out


def make_glm4_moe_lite(out: Path, tokenizer_from: Path) -> Path:
    """GLM-4.7-Flash-style: MLA with q LoRA, 4 routed experts (top-2) + 1 shared, a dense first layer listed in
    mlp_layer_types (and first_k_dense_replace, which SGLang reads), and one multi-token-prediction layer.

    rms_norm_eps is 1e-6 (GLM-4.7-Flash: 1e-5) because transformers' MLA norms always use 1e-6 while Megatron and
    SGLang use rms_norm_eps: at 1e-6 the three run the same model (docs/models.md)."""
    import transformers

    config = transformers.Glm4MoeLiteConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1,
        num_experts_per_tok=2, n_group=1, topk_group=1, routed_scaling_factor=1.8, q_lora_rank=32,
        kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, max_position_embeddings=2048,
        rms_norm_eps=1e-6, tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        first_k_dense_replace=1, eos_token_id=2, pad_token_id=3, bos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _random_expert_bias(model)
    _save(model, out, tokenizer_from)
    _add_mtp_layer(out, {"mlp_layer_types": ["dense", "sparse", "sparse"]})  # 3 main layers
    return out


# Kimi-K2 ships its config class as code next to config.json (auto_map); this is a small one of our own.
_KIMI_CONFIGURATION = '''"""Kimi-K2's configuration: DeepSeek-V3's, under the model_type "kimi_k2"."""

from transformers import DeepseekV3Config as _DeepseekV3Config


class DeepseekV3Config(_DeepseekV3Config):
    model_type = "kimi_k2"
'''


def make_kimi_k2(out: Path, tokenizer_from: Path) -> Path:
    """Kimi-K2-style: DeepSeek-V3's architecture (MLA, 4 routed experts top-2 + 1 shared, a dense first layer,
    YaRN rope) with config.json as Kimi-K2 ships it: model_type "kimi_k2", transformers 4 rope fields, and an
    auto_map to configuration_deepseek.DeepseekV3Config, which loads only with trust_remote_code."""
    import json

    import transformers

    config = transformers.DeepseekV3Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1,
        num_experts_per_tok=2, first_k_dense_replace=1, n_group=1, topk_group=1, routed_scaling_factor=2.827,
        q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 50000.0, "factor": 4.0, "beta_fast": 1.0,
                         "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 512},
        eos_token_id=2, pad_token_id=3, bos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _random_expert_bias(model)
    _save(model, out, tokenizer_from)
    saved = json.loads((out / "config.json").read_text())
    rope = saved.pop("rope_parameters")
    saved.update(
        model_type="kimi_k2",
        auto_map={"AutoConfig": "configuration_deepseek.DeepseekV3Config"},
        rope_theta=rope.pop("rope_theta"),
        rope_scaling={"type": rope.pop("rope_type"), **rope},
        # DeepSeek-V3 configuration code's own fields, which SGLang reads.
        num_nextn_predict_layers=0,
        moe_layer_freq=1,
        scoring_func="sigmoid",
        topk_method="noaux_tc",
    )
    (out / "config.json").write_text(json.dumps(saved, indent=2))
    (out / "configuration_deepseek.py").write_text(_KIMI_CONFIGURATION)
    return out


def make_glm4(out: Path, tokenizer_from: Path) -> Path:
    """GLM-4-0414-style: dense, GQA with qkv bias, interleaved rope on half of each head, sandwich norms (an RMSNorm
    after attention and after the MLP), the MLP's gate and up projections in one tensor."""
    import transformers

    config = transformers.Glm4Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, attention_bias=True, max_position_embeddings=2048, rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        eos_token_id=2, pad_token_id=3, bos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # norms away from 1, so that a missing one shows
        for name, param in model.named_parameters():
            if name.endswith("layernorm.weight"):
                param.copy_(1 + 0.5 * torch.randn(param.shape, generator=torch.Generator().manual_seed(3)))
    return _save(model, out, tokenizer_from)


# MiMo ships its config class as code next to config.json (auto_map); this is a small one of our own.
_MIMO_CONFIGURATION = '''"""MiMo's configuration: Qwen2's, under the model_type "mimo"."""

from transformers import Qwen2Config as _Qwen2Config


class MiMoConfig(_Qwen2Config):
    model_type = "mimo"
'''


def make_mimo(out: Path, tokenizer_from: Path) -> Path:
    """MiMo-7B-style: Qwen2's layers (GQA with qkv bias, untied embeddings, rope_theta 640000) and one
    multi-token-prediction layer stored as MiMo stores it, under model.mtp_layers.0 (a Qwen2 decoder layer plus
    token_layernorm, hidden_layernorm, input_proj and final_layernorm); config.json as MiMo ships it: model_type
    "mimo", transformers 4 rope fields, and an auto_map to configuration_mimo.MiMoConfig (trust_remote_code)."""
    import json

    import transformers
    from safetensors.torch import load_file, save_file

    config = transformers.Qwen2Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 640000.0}, eos_token_id=2, pad_token_id=3,
        bos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).to(torch.float32)
    with torch.no_grad():  # biases and norms away from their init (0 and 1), so that a misplaced one shows
        g = torch.Generator().manual_seed(3)
        for name, param in model.named_parameters():
            if name.endswith(("bias", "layernorm.weight", "norm.weight")):
                param.add_(0.3 * torch.randn(param.shape, generator=g))
    _save(model, out, tokenizer_from)
    # The third decoder layer becomes the MTP layer's block: 2 main layers (PP2 splits them).
    hidden, g = config.hidden_size, torch.Generator().manual_seed(2)
    stored = load_file(out / "model.safetensors")
    tensors = {name.replace("model.layers.2.", "model.mtp_layers.0."): t for name, t in stored.items()}
    for norm in ("token_layernorm", "hidden_layernorm", "final_layernorm"):
        tensors[f"model.mtp_layers.0.{norm}.weight"] = 1 + 0.1 * torch.randn(hidden, generator=g)
    tensors["model.mtp_layers.0.input_proj.weight"] = 0.02 * torch.randn(hidden, 2 * hidden, generator=g)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    saved = json.loads((out / "config.json").read_text())
    rope = saved.pop("rope_parameters")
    del saved["layer_types"]  # transformers 5's field (one per saved layer), absent from MiMo's config
    saved.update(
        model_type="mimo",
        architectures=["MiMoForCausalLM"],
        auto_map={"AutoConfig": "configuration_mimo.MiMoConfig"},
        num_hidden_layers=2,
        num_nextn_predict_layers=1,
        rope_theta=rope["rope_theta"],
        rope_scaling=None,
    )
    (out / "config.json").write_text(json.dumps(saved, indent=2))
    (out / "configuration_mimo.py").write_text(_MIMO_CONFIGURATION)
    return out


# MiniMax-M2's published config.json names its config class as code (auto_map); this is a small one of our own.
_MINIMAX_M2_CONFIGURATION = '''"""MiniMax-M2's configuration: transformers' MiniMaxM2Config, as the checkpoint's own code."""

from transformers import MiniMaxM2Config as _MiniMaxM2Config


class MiniMaxM2Config(_MiniMaxM2Config):
    model_type = "minimax_m2"
'''


def make_minimax_m2(out: Path, tokenizer_from: Path) -> Path:
    """MiniMax-M2-style: GQA with RMSNorms over all query heads and all key heads jointly, rope on the first half of
    each head, 4 experts (top-2, sigmoid scores with expert bias, no shared expert) in every layer, stored as MiniMax
    stores them (block_sparse_moe, w1/w3/w2); config.json in the published form: rotary_dim, rope_theta, the fields
    SGLang reads (use_qk_norm, qk_norm_type, scoring_func, use_routing_bias) and an auto_map to
    configuration_minimax_m2.MiniMaxM2Config (trust_remote_code). No MTP modules."""
    import json

    import transformers

    config = transformers.MiniMaxM2Config(
        vocab_size=512, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
        max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 5000000.0, "partial_rotary_factor": 0.5},
        eos_token_id=2, pad_token_id=3, bos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _random_expert_bias(model)
    with torch.no_grad():  # norms away from 1, so that a norm over the wrong heads or a missing one shows
        g = torch.Generator().manual_seed(3)
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.5 * torch.randn(param.shape, generator=g))
    _save(model, out, tokenizer_from)
    saved = json.loads((out / "config.json").read_text())
    rope = saved.pop("rope_parameters")
    saved.update(
        auto_map={"AutoConfig": "configuration_minimax_m2.MiniMaxM2Config"},
        rope_theta=rope["rope_theta"],
        rotary_dim=int(rope["partial_rotary_factor"] * config.head_dim),
        use_qk_norm=True,
        qk_norm_type="per_layer",
        scoring_func="sigmoid",
        use_routing_bias=True,
        shared_intermediate_size=0,
        attn_type_list=[1] * config.num_hidden_layers,
        use_mtp=False,
        num_mtp_modules=0,
    )
    (out / "config.json").write_text(json.dumps(saved, indent=2))
    (out / "configuration_minimax_m2.py").write_text(_MINIMAX_M2_CONFIGURATION)
    return out


def _perturb_norms_and_decay(model) -> None:
    """Random norm weights, A_log and dt_bias: transformers initialises them to constants a layout bug would hide."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("norm.weight", "A_log", "dt_bias")):
                param.add_(0.2 * torch.randn(param.shape, generator=g))


def make_qwen3_next(out: Path, tokenizer_from: Path) -> Path:
    """Qwen3-Next-style: gated delta net and gated full attention alternating (full_attention_interval 2), QK norm,
    quarter-rotary rope, zero-centered norms, 4 experts (top-2) + a gated shared expert in every layer (as the
    published model; SGLang builds every layer MoE, whatever mlp_only_layers says)."""
    import json

    import transformers

    config = transformers.Qwen3NextConfig(
        vocab_size=512, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=12, linear_conv_kernel_dim=4, full_attention_interval=2, num_experts=4,
        num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[], decoder_sparse_step=1,
        max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        eos_token_id=2, pad_token_id=3, bos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _perturb_norms_and_decay(model)
    _save(model, out, tokenizer_from)
    # The published config.json's fields, which SGLang reads (transformers 5 writes layer_types and rope_parameters).
    saved = json.loads((out / "config.json").read_text())
    saved.update(full_attention_interval=2, rope_theta=10000.0, partial_rotary_factor=0.25)
    (out / "config.json").write_text(json.dumps(saved, indent=2))
    return out


def make_qwen3_5(out: Path, tokenizer_from: Path, moe: bool = False) -> Path:
    """Qwen3.5-style (Qwen3_5ForConditionalGeneration, as published): Qwen3-Next's hybrid layers with in_proj_qkv / z /
    b / a, a dense MLP, tied embeddings, the text model under model.language_model beside a one-block vision tower.
    With `moe`, Qwen3.5-MoE's: 4 experts (top-2) + a gated shared expert in every layer, untied embeddings."""
    import transformers

    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
            "mrope_interleaved": True}  # fmt: skip
    text = dict(
        vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=12, linear_conv_kernel_dim=4, full_attention_interval=2, max_position_embeddings=4096,
        rms_norm_eps=1e-6, tie_word_embeddings=not moe, rope_parameters=rope, eos_token_id=2, pad_token_id=3,
    )  # fmt: skip
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64,
                  num_position_embeddings=16)  # fmt: skip
    if moe:
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)
        config = transformers.Qwen3_5MoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=False)
        model_class = transformers.Qwen3_5MoeForConditionalGeneration
    else:
        config = transformers.Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=True)
        model_class = transformers.Qwen3_5ForConditionalGeneration
    torch.manual_seed(0)
    model = model_class(config).to(torch.float32)
    _perturb_norms_and_decay(model)
    return _save(model, out, tokenizer_from)


def make_glm_moe_dsa(out: Path, tokenizer_from: Path, rope_interleave: bool = False) -> Path:
    """GLM-5-style: GLM-4.7-Flash's MLA + MoE (a dense first layer, one MTP layer) with a DSA indexer in every layer
    (16 heads of 16, top-6 keys), indexer weights and key norm scaled up so that the top-k is far from ties (a key
    whose ReLU'd score is 0 in every head ties at 0, and torch's top-k breaks such ties differently for rows of
    different lengths: 16 heads make that unlikely).

    `rope_interleave` is the config's indexer_rope_interleave (GLM-5: true, which SGLang reads; transformers 5 rotates
    halves whatever it says, so the logits test uses false)."""
    import transformers

    config = transformers.GlmMoeDsaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1,
        num_experts_per_tok=2, n_group=1, topk_group=1, routed_scaling_factor=2.5, q_lora_rank=32,
        kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, index_topk=6, index_head_dim=16,
        index_n_heads=16, max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, first_k_dense_replace=1,
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"], eos_token_id=2, pad_token_id=3, bos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _random_expert_bias(model)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".indexer." in name:
                centre, scale = (1.0 if name.endswith("k_norm.weight") else 0.0), (0.1 if "k_norm" in name else 0.5)
                param.copy_(centre + scale * torch.randn(param.shape, generator=g))
    _save(model, out, tokenizer_from)
    per_layer = {"mlp_layer_types": ["dense", "sparse", "sparse"], "indexer_types": ["full"] * 3}
    if getattr(config, "layer_types", None):
        per_layer["layer_types"] = config.layer_types[:3]
    _add_mtp_layer(out, {**per_layer, "indexer_rope_interleave": rope_interleave})  # 3 main layers
    return out
