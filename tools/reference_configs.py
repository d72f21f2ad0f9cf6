"""HF config.json files of the models the launch scripts target, for dry runs without the weights.

Example: python tools/reference_configs.py --model qwen3-4B --out /tmp/qwen3-4B
The sizes are those published with each model's Hugging Face checkpoint.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

_QWEN3 = dict(head_dim=128, rms_norm_eps=1e-6, rope_theta=1_000_000.0, vocab_size=151936, max_position_embeddings=40960)
REFERENCE_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
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
                                             tie_word_embeddings=False)),
}  # fmt: skip


def write_reference_config(model: str, out: str | Path) -> Path:
    """Write `model`'s config.json into `out` (created)."""
    import transformers

    if model not in REFERENCE_CONFIGS:
        raise SystemExit(f"--model {model!r} is not known; choose one of {sorted(REFERENCE_CONFIGS)}")
    class_name, fields = REFERENCE_CONFIGS[model]
    fields = dict(fields)
    theta = fields.pop("rope_theta", 10000.0)
    config = getattr(transformers, class_name)(rope_parameters={"rope_type": "default", "rope_theta": theta}, **fields)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, choices=sorted(REFERENCE_CONFIGS))
    p.add_argument("--out", required=True)
    a = p.parse_args()
    print(write_reference_config(a.model, a.out))
