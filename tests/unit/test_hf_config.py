"""One way to read an HF config (slime_like/core/hf_config.py): nested text configs, every published name of a field,
and the config code checkpoints bring (standalone transformers-4 classes with no attribute_map), read through the
modules tools/reference_configs.py writes in the shape of the published ones."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import transformers

from slime_like.core.hf_config import hf_field, hf_field_named, load_hf_config, rope_parameters
from slime_like.model_size import model_size
from slime_like.trainer.model_arguments import expected_from_hf, moe_layer_pattern
from tools.reference_configs import write_reference_config


@pytest.fixture(scope="module")
def config_of(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], object]:
    root = tmp_path_factory.mktemp("hf")
    return lambda model: load_hf_config(write_reference_config(model, root / model))


@pytest.mark.parametrize(
    ("model", "name", "experts"),
    [
        ("minimax-m2", "num_local_experts", 256),
        ("kimi-k2", "n_routed_experts", 384),
        ("moonlight", "n_routed_experts", 64),
        ("glm4.7-flash", "n_routed_experts", 64),
        ("qwen3-next-80B-A3B", "num_experts", 512),
        ("qwen3.5-35B-A3B", "num_experts", 256),  # nested under text_config
    ],
)
def test_experts_are_read_under_each_published_name(
    model: str, name: str, experts: int, config_of: Callable[[str], object]
) -> None:
    assert hf_field_named(config_of(model), "num_experts") == (name, experts)


def test_minimax_m2_experts_through_its_standalone_config_module(config_of: Callable[[str], object]) -> None:
    """MiniMax-M2's configuration_minimax_m2.py stores num_local_experts and has no attribute_map: transformers'
    num_experts alias is absent, and the checks must still find 256 experts in every one of its 62 layers."""
    config = config_of("minimax-m2")
    assert type(config).__bases__ == (transformers.PretrainedConfig,) and not type(config).attribute_map
    assert getattr(config, "num_experts", None) is None and getattr(config, "n_routed_experts", None) is None
    assert moe_layer_pattern(config) == ("decoder_sparse_step / mlp_only_layers", [1] * 62)
    expected = expected_from_hf(config)
    assert expected["num_experts"] == ("num_local_experts", 256)
    assert expected["moe_ffn_hidden_size"] == ("intermediate_size", 1536)  # no moe_intermediate_size: the experts'
    assert expected["rotary_percent"] == ("rotary_dim / head_dim", 0.5)
    assert expected["rotary_base"] == ("rope_theta", 5000000)
    assert expected["mtp_num_layers"] == ("num_mtp_modules", 3)
    assert "moe_shared_expert_intermediate_size" not in expected  # shared_intermediate_size 0: none
    size = model_size(config)
    assert size.expert_params == 62 * 256 * 3 * 3072 * 1536 and size.served_bytes_per_param == 1  # FP8


def test_deepseek_config_module_of_transformers_4_keeps_rope_at_the_top(config_of: Callable[[str], object]) -> None:
    """configuration_deepseek.py (Kimi-K2, Moonlight) stores rope_theta and rope_scaling at the top level."""
    kimi = config_of("kimi-k2")
    assert type(kimi).__bases__ == (transformers.PretrainedConfig,) and kimi.model_type == "kimi_k2"
    rope = rope_parameters(kimi)
    assert (rope["rope_theta"], rope["type"], rope["factor"], rope["mscale_all_dim"]) == (50000.0, "yarn", 32.0, 1.0)
    expected = expected_from_hf(kimi)
    assert expected["rotary_base"] == ("rope_theta", 50000.0)
    assert expected["rotary_scaling_factor"] == ("rope_scaling.factor", 32.0)
    assert expected["moe_shared_expert_intermediate_size"] == ("n_shared_experts x moe_intermediate_size", 2048)
    assert moe_layer_pattern(kimi) == ("first_k_dense_replace", [0] + [1] * 60)
    moonlight = config_of("moonlight")
    assert rope_parameters(moonlight)["rope_theta"] == 50000.0 and hf_field(moonlight, "q_lora_rank") is None
    assert expected_from_hf(moonlight)["rotary_scaling_factor"] == ("rope_scaling.factor", 1.0)  # no YaRN


def test_mimo_config_module_counts_its_mtp_layer(config_of: Callable[[str], object]) -> None:
    config = config_of("mimo-7B-rl")
    assert isinstance(config, transformers.Qwen2Config) and config.model_type == "mimo"
    assert hf_field_named(config, "mtp_num_layers") == ("num_nextn_predict_layers", 1)
    assert rope_parameters(config)["rope_theta"] == 640000


def test_qwen3_5_outer_config_is_read_through_its_text_config(config_of: Callable[[str], object]) -> None:
    config = config_of("qwen3.5-27B")
    assert not hasattr(config, "num_attention_heads")  # what the planner read before: an AttributeError
    sizes = [hf_field(config, f) for f in ("num_attention_heads", "num_key_value_heads", "num_hidden_layers")]
    assert sizes == [24, 4, 64]
    assert hf_field(config, "model_type") == "qwen3_5_text" and config.model_type == "qwen3_5"
    rope = rope_parameters(config)
    assert rope["rope_theta"] == 10000000 and rope["partial_rotary_factor"] == 0.25


def test_a_field_only_the_outer_config_holds_is_read_there(tmp_path: Path) -> None:
    """Qwen3.5's FP8 checkpoints put quantization_config beside text_config: SGLang serves them at 1 byte a weight."""
    path = write_reference_config("qwen3.5-27B", tmp_path / "fp8")
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
    (path / "config.json").write_text(json.dumps(config))
    assert model_size(load_hf_config(path)).served_bytes_per_param == 1
    bf16 = load_hf_config(write_reference_config("qwen3.5-27B", tmp_path / "bf16"))
    assert model_size(bf16).served_bytes_per_param == 2


def test_absent_field_gives_the_default(config_of: Callable[[str], object]) -> None:
    config = config_of("qwen3.5-27B")
    assert hf_field_named(config, "num_experts") == ("num_experts", None)
    assert hf_field(config, "num_experts", 0) == 0 and moe_layer_pattern(config) is None
