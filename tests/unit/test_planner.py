"""Parameter counts and memory arithmetic of the planner, against independent counts."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import transformers

from slime_like.planner import GIB, _layers_per_stage, model_size, training_memory


def real_count(config: transformers.PretrainedConfig) -> int:
    """The number of parameters transformers actually builds for this config."""
    model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def test_counts_match_the_tiny_dense_and_moe_models(
    tiny_qwen3: Path, tiny_qwen3_moe: Path, tiny_qwen2_untied: Path
) -> None:
    for path in (tiny_qwen3, tiny_qwen3_moe):
        config = transformers.AutoConfig.from_pretrained(path)
        assert model_size(config).total == real_count(config)


def test_count_matches_a_small_mla_moe_model() -> None:
    config = transformers.DeepseekV3Config(
        hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32,
        first_k_dense_replace=1, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
        v_head_dim=8, vocab_size=100, tie_word_embeddings=False, n_group=1, topk_group=1,
    )  # fmt: skip
    size = model_size(config)
    assert size.total == real_count(config)
    assert size.expert_params == 2 * 4 * 3 * 64 * 32  # 2 MoE layers x 4 experts x (gate, up, down)


def test_published_sizes() -> None:
    from tools.reference_configs import REFERENCE_CONFIGS  # noqa: F401 - the table the dry runs use

    config = transformers.Qwen3Config(
        hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, vocab_size=151936, tie_word_embeddings=True,
    )  # fmt: skip
    assert model_size(config).total / 1e9 == pytest.approx(4.02, abs=0.01)  # Qwen3-4B: 4.0B


def args(**kw: object) -> SimpleNamespace:
    base = dict(
        world_size=8, tensor_model_parallel_size=2, pipeline_model_parallel_size=1, context_parallel_size=1,
        expert_model_parallel_size=1, expert_tensor_parallel_size=None, bf16=True, use_distributed_optimizer=True,
        max_tokens_per_gpu=1000, decoder_first_pipeline_num_layers=None, decoder_last_pipeline_num_layers=None,
    )  # fmt: skip
    return SimpleNamespace(**{**base, **kw})


def test_training_memory_hand_computed() -> None:
    # 1e9 dense params, TP 2 -> 5e8 per GPU: bf16 weights 1e9 B, fp32 grads 2e9 B,
    # Adam 12 B/param over DP 4 -> 1.5e9 B; activations 34 * 1000 tokens * 1000 hidden * 10 layers / TP 2 = 1.7e8 B.
    size = SimpleNamespace(dense_params=10**9, expert_params=0, hidden=1000, layers=10)
    mem = training_memory(args(), size)
    assert mem == pytest.approx({"weights": 1e9, "grads": 2e9, "optimizer": 1.5e9, "activations": 1.7e8})
    assert sum(mem.values()) / GIB == pytest.approx(4.67e9 / GIB)


def test_uneven_pipeline_stages() -> None:
    assert _layers_per_stage(args(pipeline_model_parallel_size=8), 61) is None
    assert _layers_per_stage(args(pipeline_model_parallel_size=8, decoder_first_pipeline_num_layers=7,
                                  decoder_last_pipeline_num_layers=6), 61) == 8  # fmt: skip
    assert _layers_per_stage(args(pipeline_model_parallel_size=4), 48) == 12
