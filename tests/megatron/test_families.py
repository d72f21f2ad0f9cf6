"""The family registry: Llama 3, Qwen3-MoE, DeepSeek-V3 (MLA + MoE), GLM-4.5 (partial rope, sigmoid MoE, an MTP
layer), GLM-4.7-Flash (MLA + MoE, an MTP layer), Kimi-K2 (custom config code, YaRN), GLM-4 (sandwich norms,
interleaved partial rope) and MiMo (custom config code, MTP layers of its own names) built on CPU match transformers and export back bit-exactly; name templates and tensor layouts in isolation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from slime_like.megatron.conversion import AttentionShape, shard, to_hf, to_megatron, unshard
from slime_like.megatron.families import FAMILIES, family_of, template
from tests.megatron.tiny_families import (
    make_deepseek_v3,
    make_glm4,
    make_glm4_moe,
    make_glm4_moe_lite,
    make_kimi_k2,
    make_llama3,
    make_mimo,
)

MODELS = [
    "tiny_qwen3_moe",
    "tiny_llama3",
    "tiny_deepseek_v3",
    "tiny_glm4_moe",
    "tiny_glm4_moe_lite",
    "tiny_kimi_k2",
    "tiny_glm4",
    "tiny_mimo",
]


@pytest.fixture(scope="module")
def tiny_llama3(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_llama3(tmp_path_factory.mktemp("tiny-llama3"), tiny_qwen3)


@pytest.fixture(scope="module")
def tiny_deepseek_v3(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_deepseek_v3(tmp_path_factory.mktemp("tiny-deepseek-v3"), tiny_qwen3)


@pytest.fixture(scope="module")
def tiny_glm4_moe(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_glm4_moe(tmp_path_factory.mktemp("tiny-glm4-moe"), tiny_qwen3)


@pytest.fixture(scope="module")
def tiny_glm4_moe_lite(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_glm4_moe_lite(tmp_path_factory.mktemp("tiny-glm4-moe-lite"), tiny_qwen3)


@pytest.fixture(scope="module")
def tiny_kimi_k2(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_kimi_k2(tmp_path_factory.mktemp("tiny-kimi-k2"), tiny_qwen3)


@pytest.fixture(scope="module")
def tiny_glm4(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_glm4(tmp_path_factory.mktemp("tiny-glm4"), tiny_qwen3)


@pytest.fixture(scope="module")
def tiny_mimo(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_mimo(tmp_path_factory.mktemp("tiny-mimo"), tiny_qwen3)


def transformers_model(hf_dir: Path):
    """The transformers model of a checkpoint, fp32, in eval mode."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(hf_dir, trust_remote_code=True)
    if config.model_type == "mimo":
        # MiMo's modeling code is Qwen2's plus MTP layers that the causal-LM logits do not use: transformers' Qwen2
        # is the reference (it leaves the model.mtp_layers tensors unread).
        config = transformers.Qwen2Config.from_pretrained(hf_dir)
        return transformers.Qwen2ForCausalLM.from_pretrained(hf_dir, config=config, dtype=torch.float32).eval()
    if config.model_type != "kimi_k2":
        return transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    # Kimi-K2's modeling code is transformers' DeepSeek-V3, whose loader fuses the per-expert tensors of a
    # checkpoint only for the model_type deepseek_v3 (under kimi_k2 it leaves the experts random).
    config = transformers.DeepseekV3Config.from_pretrained(hf_dir)
    config.model_type = "deepseek_v3"
    return transformers.DeepseekV3ForCausalLM.from_pretrained(hf_dir, config=config, dtype=torch.float32).eval()


def safetensors_of(hf_dir: Path) -> dict[str, torch.Tensor]:
    """The tensors as stored (transformers 5 fuses MoE experts in its state_dict, not on disk)."""
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(Path(hf_dir).glob("*.safetensors")):
        tensors.update(load_file(path))
    return tensors


def _megatron_model(hf_dir: Path):
    from slime_like.megatron.model import build_model, load_hf_weights, make_bridge

    bridge = make_bridge(hf_dir, torch.float32)
    model = build_model(bridge, wrap_with_ddp=False)
    load_hf_weights(bridge, model, hf_dir)
    return bridge, model


@pytest.mark.parametrize("fixture", MODELS)
def test_logits_match_transformers(fixture: str, request: pytest.FixtureRequest, megatron_world) -> None:
    hf_dir = request.getfixturevalue(fixture)
    _, model = _megatron_model(hf_dir)
    tokens = torch.randint(0, 512, (2, 23), generator=torch.Generator().manual_seed(1))
    mask = ~torch.ones(23, 23, dtype=torch.bool).tril()[None, None].expand(2, 1, 23, 23)
    # Far positions: Llama 3's rope scaling changes the low frequencies, visible there (2e-5 without it).
    positions = torch.arange(23)[None].expand(2, 23) + 1800
    with torch.no_grad():
        logits = model[0].eval()(tokens, positions, mask)
        expected = transformers_model(hf_dir)(tokens, position_ids=positions).logits
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("fixture", MODELS)
def test_export_is_bit_exact(fixture: str, request: pytest.FixtureRequest, megatron_world) -> None:
    from slime_like.megatron.model import export_hf_weights, untrained_hf_weights

    hf_dir = request.getfixturevalue(fixture)
    bridge, model = _megatron_model(hf_dir)
    exported = dict(export_hf_weights(bridge, model))
    # Megatron builds no multi-token-prediction layer: its tensors come from the checkpoint, unchanged.
    untrained = dict(untrained_hf_weights(bridge))
    # GLM-4.5 and DeepSeek-V3 store it as the layer after the last main one, MiMo under model.mtp_layers.
    mtp = (f"model.layers.{bridge.hf_config.num_hidden_layers}.", "model.mtp_layers.0.")
    assert all(name.startswith(mtp) for name in untrained)
    assert bool(untrained) == bool(getattr(bridge.hf_config, "num_nextn_predict_layers", 0))
    expected = safetensors_of(hf_dir)
    assert sorted(exported) == sorted(set(expected) - set(untrained))
    for name, tensor in {**exported, **untrained}.items():
        assert tensor.dtype == expected[name].dtype and torch.equal(tensor, expected[name]), name


def test_templates_cover_local_and_transformer_engine_names() -> None:
    experts = "decoder.layers.{layer}.mlp.experts.local_experts.{expert}.linear_fc1.weight"
    assert template("decoder.layers.3.mlp.experts.local_experts.5.linear_fc1.weight") == (experts, 3, 5)
    assert template("decoder.layers.3.mlp.experts.linear_fc1.weight5") == (experts, 3, 5)
    assert template("decoder.layers.0.self_attention.linear_qkv.layer_norm_weight") == (
        "decoder.layers.{layer}.input_layernorm.weight",
        0,
        None,
    )
    assert template("embedding.word_embeddings.weight") == ("embedding.word_embeddings.weight", None, None)
    # Every family maps both norms of a layer, whatever spec built it.
    for family in FAMILIES.values():
        assert "decoder.layers.{layer}.input_layernorm.weight" in family.rules
        assert "decoder.layers.{layer}.pre_mlp_layernorm.weight" in family.rules


def test_unknown_family_is_refused_by_name() -> None:
    class Config:
        model_type = "gpt_neox"

    with pytest.raises(ValueError, match="model_type 'gpt_neox' is not supported; registered families"):
        family_of(Config())


@pytest.mark.parametrize("tp", [2, 4])
def test_fused_layouts_shard_and_unshard_exactly(tp: int) -> None:
    g = torch.Generator().manual_seed(0)
    attn = AttentionShape(num_heads=8, num_query_groups=4, head_dim=3)
    q, k, v = torch.randn(24, 5, generator=g), torch.randn(12, 5, generator=g), torch.randn(12, 5, generator=g)
    qkv = to_megatron("qkv", [q, k, v], attn)
    # Megatron's layout: per query group, its 2 query heads, then its key, then its value.
    assert torch.equal(qkv[:12], torch.cat([q[:6], k[:3], v[:3]]))
    for got, want in zip(to_hf("qkv", qkv, attn), (q, k, v), strict=True):
        assert torch.equal(got, want)
    gate, up = torch.randn(8, 5, generator=g), torch.randn(8, 5, generator=g)
    fc1 = to_megatron("gate_up", [gate, up], None)
    shards = [shard("gate_up", fc1, 0, tp, r) for r in range(tp)]
    # Each TP rank holds its part of the gate followed by its part of the up projection.
    assert torch.equal(shards[1], torch.cat([gate.chunk(tp)[1], up.chunk(tp)[1]]))
    assert torch.equal(unshard("gate_up", shards, 0), fc1)
    qkv_shards = [shard("qkv", qkv, 0, tp, r) for r in range(tp)]
    assert torch.equal(unshard("qkv", qkv_shards, 0), qkv)


def test_vocab_padding_is_added_and_removed() -> None:
    embedding = torch.randn(10, 4)
    padded = to_megatron("vocab", [embedding], None, rows=16)
    assert padded.shape == (16, 4) and not padded[10:].any()
    assert torch.equal(to_hf("vocab", padded, None, hf_rows=10)[0], embedding)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"norm_topk_prob": False}, "norm_topk_prob=false in the HF config"),
        ({"n_group": 2, "topk_group": 2}, "num_experts_per_tok=2 and topk_group=2 in the HF config"),
        ({"scoring_func": "softmax", "topk_method": "greedy"}, "scoring_func='softmax' / topk_method='greedy'"),
        ({"mlp_layer_types": ["dense", "dense", "sparse"]}, "mlp_layer_types and first_k_dense_replace=1"),
    ],
)
def test_routing_megatron_would_run_differently_is_refused_by_field(fields: dict, message: str) -> None:
    import transformers

    from slime_like.megatron.bridges import sigmoid_moe_args

    base = dict(num_hidden_layers=3, n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1)
    assert sigmoid_moe_args(transformers.Glm4MoeConfig(**base))["moe_layer_freq"] == [0, 1, 1]
    with pytest.raises(ValueError, match=message):
        sigmoid_moe_args(transformers.Glm4MoeConfig(**base, **fields))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"use_sliding_window": True, "sliding_window": 8}, "use_sliding_window=true in the HF config"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_type 'linear' in the HF config"),
    ],
)
def test_mimo_configs_megatron_would_run_differently_are_refused(
    fields: dict, message: str, tiny_mimo: Path, tmp_path: Path, megatron_world
) -> None:
    import json

    from slime_like.megatron.model import make_bridge

    for name in ("config.json", "configuration_mimo.py"):  # the model is refused before any weight is read
        (tmp_path / name).write_bytes((tiny_mimo / name).read_bytes())
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **fields}))
    with pytest.raises(ValueError, match=message):
        make_bridge(tmp_path, torch.float32)
