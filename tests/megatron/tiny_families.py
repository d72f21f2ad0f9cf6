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
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # a non-zero expert bias, so that routing depends on it
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(torch.randn(buffer.shape, generator=torch.Generator().manual_seed(1)) * 0.1)
    return _save(model, out, tokenizer_from)
