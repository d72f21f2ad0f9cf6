"""The family registry: Llama 3, Qwen3-MoE, DeepSeek-V3 (MLA + MoE), GLM-4.5 (partial rope, sigmoid MoE, an MTP
layer), GLM-4.7-Flash (MLA + MoE, an MTP layer), Kimi-K2 (custom config code, YaRN), GLM-4 (sandwich norms,
interleaved partial rope), MiMo (custom config code, MTP layers of its own names) and MiniMax-M2 (QK norm over all heads,
also at TP2) built on CPU match transformers and export back bit-exactly; name templates and tensor layouts in isolation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from slime_like.trainer.megatron.conversion import AttentionShape, shard, to_hf, to_megatron, unshard
from slime_like.trainer.megatron.families import FAMILIES, family_of, template
from tests.megatron.common import forward_on_device
from tests.megatron.tiny_families import (
    make_deepseek_v3,
    make_glm4,
    make_glm4_moe,
    make_glm4_moe_lite,
    make_kimi_k2,
    make_llama3,
    make_mimo,
    make_minimax_m2,
    make_qwen3_5,
    make_qwen3_next,
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
    "tiny_minimax_m2",
    "tiny_qwen3_next",
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


@pytest.fixture(scope="module")
def tiny_minimax_m2(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_minimax_m2(tmp_path_factory.mktemp("tiny-minimax-m2"), tiny_qwen3)


@pytest.fixture(scope="module")
def tiny_qwen3_next(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_qwen3_next(tmp_path_factory.mktemp("tiny-qwen3-next"), tiny_qwen3)


def transformers_model(hf_dir: Path):
    """The transformers model of a checkpoint, fp32, in eval mode."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(hf_dir, trust_remote_code=True)
    if config.model_type == "mimo":
        # MiMo's modeling code is Qwen2's plus MTP layers that the causal-LM logits do not use: transformers' Qwen2
        # is the reference (it leaves the model.mtp_layers tensors unread).
        config = transformers.Qwen2Config.from_pretrained(hf_dir)
        return transformers.Qwen2ForCausalLM.from_pretrained(hf_dir, config=config, dtype=torch.float32).eval()
    if config.model_type == "minimax_m2":
        # transformers' MiniMaxM2 rotates rope_parameters' partial_rotary_factor of each head; the published config
        # (and SGLang, which the trainer follows) gives rotary_dim instead.
        config = transformers.MiniMaxM2Config.from_pretrained(hf_dir)
        config.rope_parameters["partial_rotary_factor"] = config.rotary_dim / config.head_dim
        return transformers.MiniMaxM2ForCausalLM.from_pretrained(hf_dir, config=config, dtype=torch.float32).eval()
    if config.model_type != "kimi_k2":
        return transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    # Kimi-K2's modeling code is transformers' DeepSeek-V3, whose loader fuses the per-expert tensors of a
    # checkpoint only for the model_type deepseek_v3 (under kimi_k2 it leaves the experts random).
    config = transformers.DeepseekV3Config.from_pretrained(hf_dir)
    config.model_type = "deepseek_v3"
    return transformers.DeepseekV3ForCausalLM.from_pretrained(hf_dir, config=config, dtype=torch.float32).eval()


def hf_logits(reference: torch.nn.Module, like: torch.nn.Module, tokens: torch.Tensor, positions: torch.Tensor):
    """transformers' logits computed on the device of `like` (on a GPU both sides then run fla's Triton kernels for
    the gated delta net: transformers picks them whenever fla is installed, and they take no CPU tensor)."""
    device = next(like.parameters()).device
    return reference.to(device)(tokens.to(device), position_ids=positions.to(device)).logits.cpu()


def logits_atol(model: torch.nn.Module, hf_config) -> float:
    """1e-5, or 5e-5 for a gated delta net on a GPU: fla's Triton kernels take fp32 dots in TF32 there, and the two
    models' kernel inputs differ in their last bits (2.0e-5 and 2.4e-5 measured on an H100, docs/performance.md)."""
    gated_delta_net = "linear_num_value_heads" in getattr(hf_config, "text_config", hf_config).to_dict()
    return 5e-5 if gated_delta_net and next(model.parameters()).is_cuda else 1e-5


def safetensors_of(hf_dir: Path) -> dict[str, torch.Tensor]:
    """The tensors as stored (transformers 5 fuses MoE experts in its state_dict, not on disk)."""
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(Path(hf_dir).glob("*.safetensors")):
        tensors.update(load_file(path))
    return tensors


def _megatron_model(hf_dir: Path):
    from slime_like.trainer.megatron.model import build_model, load_hf_weights, make_bridge

    bridge = make_bridge(hf_dir, torch.float32)
    model = build_model(bridge, wrap_with_ddp=False)
    load_hf_weights(bridge, model, hf_dir)
    return bridge, model


@pytest.mark.parametrize("fixture", MODELS)
def test_logits_match_transformers(fixture: str, request: pytest.FixtureRequest, megatron_world) -> None:
    hf_dir = request.getfixturevalue(fixture)
    bridge, model = _megatron_model(hf_dir)
    tokens = torch.randint(0, 512, (2, 23), generator=torch.Generator().manual_seed(1))
    mask = ~torch.ones(23, 23, dtype=torch.bool).tril()[None, None].expand(2, 1, 23, 23)
    # Far positions: Llama 3's rope scaling changes the low frequencies, visible there (2e-5 without it).
    positions = torch.arange(23)[None].expand(2, 23) + 1800
    with torch.no_grad():
        logits = forward_on_device(model[0].eval(), tokens, positions, mask)
        expected = hf_logits(transformers_model(hf_dir), model[0], tokens, positions)
    torch.testing.assert_close(logits, expected, atol=logits_atol(model[0], bridge.hf_config), rtol=0)


@pytest.mark.parametrize("fixture", MODELS)
def test_export_is_bit_exact(fixture: str, request: pytest.FixtureRequest, megatron_world) -> None:
    from slime_like.trainer.megatron.model import export_hf_weights, untrained_hf_weights

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
        got = tensor.cpu()
        assert got.dtype == expected[name].dtype and torch.equal(got, expected[name]), mismatch(
            name, got, expected[name]
        )


def mismatch(name: str, got: torch.Tensor, stored: torch.Tensor) -> str:
    """What differs between an exported tensor and the stored one: dtype, shape or the largest difference."""
    if got.dtype != stored.dtype or got.shape != stored.shape:
        return f"{name}: {got.dtype} {tuple(got.shape)} exported, {stored.dtype} {tuple(stored.shape)} stored"
    return f"{name}: largest difference {(got.double() - stored.double()).abs().max().item():.3g}"


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

    from slime_like.trainer.megatron.bridges import sigmoid_moe_args

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

    from slime_like.trainer.megatron.model import make_bridge

    for name in ("config.json", "configuration_mimo.py"):  # the model is refused before any weight is read
        (tmp_path / name).write_bytes((tiny_mimo / name).read_bytes())
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **fields}))
    with pytest.raises(ValueError, match=message):
        make_bridge(tmp_path, torch.float32)


def test_minimax_m2_at_tp2_matches_one_process(tiny_minimax_m2: Path, megatron_world, tmp_path: Path) -> None:
    """The all-heads QK norm spans both ranks' heads: TP2 logits and every weight's gradient equal TP1's."""
    import json

    from tests.megatron.all_heads_norm_worker import logits_and_grads
    from tests.megatron.launch import torchrun

    one_kv = tmp_path / "one-kv-head"  # a config only: it is refused before any weight is read
    one_kv.mkdir()
    (one_kv / "configuration_minimax_m2.py").write_bytes((tiny_minimax_m2 / "configuration_minimax_m2.py").read_bytes())
    config = json.loads((tiny_minimax_m2 / "config.json").read_text())
    (one_kv / "config.json").write_text(json.dumps({**config, "num_key_value_heads": 1}))
    worker = Path(__file__).with_name("all_heads_norm_worker.py")
    torchrun(worker, [str(tiny_minimax_m2), str(tmp_path / "tp2.pt"), str(one_kv)])
    got = torch.load(tmp_path / "tp2.pt", weights_only=False)
    assert "--tensor-model-parallel-size 2 is larger than num_key_value_heads=1" in got["one_kv_head_error"]
    want = logits_and_grads(tiny_minimax_m2)
    torch.testing.assert_close(got["logits"], want["logits"], atol=1e-5, rtol=0)
    assert sorted(got["grads"]) == sorted(want["grads"])
    for name in ("model.layers.0.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight"):
        assert want["grads"][name].abs().max() > 1e-4, name  # the norms take part in the gradient
    for name, grad in want["grads"].items():
        if ".block_sparse_moe.experts." in name:
            # Megatron's MoE at TP>1 without sequence parallel (which it refuses in training) sends every token to
            # the experts from both TP ranks: twice the gradient. On GPU the trainer runs TP>1 MoE with it on.
            torch.testing.assert_close(got["grads"][name], 2 * grad, atol=1e-6, rtol=1e-4, msg=name)
        else:
            torch.testing.assert_close(got["grads"][name], grad, atol=1e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"partial_rotary_factor": 0.25}, "rotary_dim=8 and partial_rotary_factor=0.25 .head_dim=16. in the HF config"),
        ({"scoring_func": "softmax"}, "scoring_func='softmax' in the HF config: minimax_m2 is supported with"),
        ({"shared_intermediate_size": 32}, "shared_intermediate_size=32 in the HF config"),
        ({"qk_norm_type": "per_head"}, "qk_norm_type='per_head' in the HF config"),
    ],
)
def test_minimax_m2_configs_megatron_would_run_differently_are_refused(
    fields: dict, message: str, tiny_minimax_m2: Path, tmp_path: Path, megatron_world
) -> None:
    import json

    from slime_like.trainer.megatron.model import make_bridge

    for name in ("config.json", "configuration_minimax_m2.py"):  # the model is refused before any weight is read
        (tmp_path / name).write_bytes((tiny_minimax_m2 / name).read_bytes())
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **fields}))
    with pytest.raises(ValueError, match=message):
        make_bridge(tmp_path, torch.float32)


def test_fp8_checkpoint_is_refused_at_load(tiny_minimax_m2: Path, tmp_path: Path, megatron_world) -> None:
    """MiniMax-M2's published weights are FP8 with block scales: loading them as they are would drop the scales."""
    from safetensors.torch import save_file

    from slime_like.trainer.megatron.model import build_model, load_hf_weights, make_bridge

    for name in ("config.json", "configuration_minimax_m2.py"):
        (tmp_path / name).write_bytes((tiny_minimax_m2 / name).read_bytes())
    tensors = safetensors_of(tiny_minimax_m2)
    name = "model.layers.0.self_attn.q_proj.weight"
    tensors[name] = tensors[name].to(torch.float8_e4m3fn)
    tensors[name + "_scale_inv"] = torch.ones(1, 1)
    save_file(tensors, tmp_path / "model.safetensors")
    bridge = make_bridge(tmp_path, torch.float32)
    model = build_model(bridge, wrap_with_ddp=False)
    with pytest.raises(ValueError, match=f"stores {name} in torch.float8_e4m3fn .an FP8 checkpoint.*fp8_cast_bf16"):
        load_hf_weights(bridge, model, tmp_path)


def test_qwen3_next_packed_sequences_match_separate_forwards(tiny_qwen3_next: Path, megatron_world) -> None:
    """Two sequences in one row (block-diagonal mask, the CPU trainer's layout): the gated delta net's state does not
    cross from the first into the second, so each sequence's logits equal its own forward's."""
    _, model = _megatron_model(tiny_qwen3_next)
    g = torch.Generator().manual_seed(2)
    first, second = torch.randint(0, 512, (1, 9), generator=g), torch.randint(0, 512, (1, 14), generator=g)

    def causal(n: int) -> torch.Tensor:
        return ~torch.ones(n, n, dtype=torch.bool).tril()

    mask = torch.ones(23, 23, dtype=torch.bool)
    mask[:9, :9], mask[9:, 9:] = causal(9), causal(14)
    m = model[0].eval()
    with torch.no_grad():
        alone = [
            forward_on_device(m, t, torch.arange(t.shape[1])[None], causal(t.shape[1])[None, None])
            for t in (first, second)
        ]
        positions = torch.cat([torch.arange(9), torch.arange(14)])[None]
        packed = forward_on_device(m, torch.cat([first, second], 1), positions, mask[None, None])
    torch.testing.assert_close(packed[:, :9], alone[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(packed[:, 9:], alone[1], atol=1e-5, rtol=0)
    # The layer alone, as THD's cu_seqlens give the boundaries too: the packed row at once (conv and delta rule cut
    # at the boundary) equals megatron-core's forward run per sequence, outputs and gradients (conv1d, A_log, ...).
    from megatron.core.packed_seq_params import PackedSeqParams

    gdn = m.decoder.layers[0].self_attention
    device = next(m.parameters()).device
    hidden = torch.randn(23, 1, 64, generator=g).to(device)
    cu_seqlens = torch.tensor([0, 9, 23], dtype=torch.int32, device=device)
    thd = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu_seqlens)
    weights = torch.randn(23, 1, 64, generator=g).to(device)

    def run(forward) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        gdn.zero_grad()
        out = forward()
        (out * weights).sum().backward()
        return out.detach(), {n: p.grad.clone() for n, p in gdn.named_parameters()}

    separate, separate_grads = run(lambda: torch.cat([gdn(hidden[:9], None)[0], gdn(hidden[9:], None)[0]]))
    for forward in (
        lambda: gdn(hidden, mask[None, None].to(device))[0],
        lambda: gdn(hidden, None, packed_seq_params=thd)[0],
    ):
        out, grads = run(forward)
        torch.testing.assert_close(out, separate, atol=1e-6, rtol=0)
        assert list(grads) == list(separate_grads) and "conv1d.weight" in grads
        for name, grad in grads.items():
            torch.testing.assert_close(grad, separate_grads[name], atol=1e-6 * separate_grads[name].abs().max(), rtol=0)


@pytest.mark.parametrize("tp", [1, 2])
def test_gated_delta_net_layouts_shard_and_round_trip_exactly(tp: int) -> None:
    """Qwen3-Next's in_proj_qkvz/in_proj_ba (grouped per key head) become Megatron's [q; k; v; z; b; a]; each TP rank
    takes its share of every part; gated attention's per-head [query, gate] rows become per-group blocks."""
    g = torch.Generator().manual_seed(0)
    nk, nv, dk, dv, hidden = 2, 4, 3, 5, 7
    attn = AttentionShape(num_heads=4, num_query_groups=2, head_dim=3, linear=(nk, nv, dk, dv))
    qkvz = torch.randn(nk * (2 * dk + 2 * (nv // nk) * dv), hidden, generator=g)
    ba = torch.randn(2 * nv, hidden, generator=g)
    in_proj = to_megatron("gdn_in_proj", [qkvz, ba], attn)
    # The first key head's query rows lead both layouts; Megatron's second query head follows at once.
    assert torch.equal(in_proj[:dk], qkvz[:dk]) and torch.equal(in_proj[dk : 2 * dk], qkvz[qkvz.shape[0] // nk :][:dk])
    assert all(torch.equal(a, b) for a, b in zip(to_hf("gdn_in_proj", in_proj, attn), (qkvz, ba), strict=True))
    shards = [shard("gdn_in_proj", in_proj, 0, tp, r, attn) for r in range(tp)]
    assert torch.equal(unshard("gdn_in_proj", shards, 0, attn), in_proj)
    q_rows = nk * dk // tp  # rank 0 starts with its share of the queries, then of the keys
    assert torch.equal(shards[0][q_rows : 2 * q_rows], in_proj[nk * dk :][:q_rows])
    q, k, v = (torch.randn(n, hidden, generator=g) for n in (24, 6, 6))
    qkv = to_megatron("gated_qkv", [q, k, v], attn)
    # Group 0: its two heads' queries, their two gates, its key, its value.
    assert torch.equal(qkv[:12], torch.cat([q[0:3], q[6:9], q[3:6], q[9:12]]))
    assert all(torch.equal(a, b) for a, b in zip(to_hf("gated_qkv", qkv, attn), (q, k, v), strict=True))


def test_published_qwen3_next_config_builds_its_megatron_config(tmp_path: Path, megatron_world) -> None:
    """Qwen3-Next-80B-A3B's config.json: 48 layers, every 4th full attention, 512 experts with a gated shared expert."""
    from slime_like.trainer.megatron.model import make_bridge

    source = Path(__file__).parents[2] / "tools" / "hf_configs" / "qwen3-next-80B-A3B.json"
    (tmp_path / "config.json").write_text(source.read_text())
    config = make_bridge(tmp_path, torch.bfloat16).config
    assert config.linear_attention_freq == [0 if (i + 1) % 4 == 0 else 1 for i in range(48)]
    assert (config.num_moe_experts, config.moe_router_topk, config.moe_shared_expert_gate) == (512, 10, True)
    assert (config.kv_channels, config.attention_output_gate, config.layernorm_zero_centered_gamma) == (256, True, True)
    assert (config.linear_num_key_heads, config.linear_num_value_heads, config.linear_key_head_dim) == (16, 32, 128)


def test_qwen3_next_trains(tiny_qwen3_next: Path, megatron_world) -> None:
    """Optimizer steps on packed micro-batches: the loss falls and the gated delta net's own weights move."""
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.optimizer import OptimizerSettings
    from tests.megatron.common import fixed_batch, num_targets, token_ce_loss

    engine = MegatronTrainEngine(tiny_qwen3_next, OptimizerSettings(lr=1e-2), max_tokens_per_micro_batch=40)
    seqs = fixed_batch()[:4]  # 61 tokens: two micro-batches, sequences packed two to a row
    before = {name: t.clone() for name, t in engine.export_hf_weights()}
    losses = [engine.train_step(seqs, [None] * len(seqs), token_ce_loss(num_targets(seqs)))["loss"] for _ in range(2)]
    after = dict(engine.export_hf_weights())
    assert losses[1] < losses[0], losses
    for name in ("in_proj_qkvz", "in_proj_ba", "conv1d", "A_log", "dt_bias", "linear_attn.norm", "shared_expert_gate"):
        moved = [k for k in before if name in k and not torch.equal(before[k], after[k])]
        assert moved, name


@pytest.mark.parametrize("moe", [False, True], ids=["qwen3_5", "qwen3_5_moe"])
def test_qwen3_5_text_model_matches_transformers_and_exports_bit_exactly(
    moe: bool, tiny_qwen3: Path, tmp_path: Path, megatron_world
) -> None:
    """Qwen3.5's text model (text_config, model.language_model names) against transformers' full model on text; its
    vision tower is built beside it (model.visual.*, vision_language.py; images: tests/megatron/test_vlm_parity.py),
    and the export is the checkpoint, bit-exactly."""
    import transformers

    from slime_like.trainer.megatron.model import export_hf_weights, untrained_hf_weights

    hf_dir = make_qwen3_5(tmp_path / "tiny", tiny_qwen3, moe=moe)
    bridge, model = _megatron_model(hf_dir)
    assert bridge.hf_config.model_type == ("qwen3_5_moe_text" if moe else "qwen3_5_text")
    tokens = torch.randint(0, 512, (2, 23), generator=torch.Generator().manual_seed(1))
    mask = ~torch.ones(23, 23, dtype=torch.bool).tril()[None, None].expand(2, 1, 23, 23)
    positions = torch.arange(23)[None].expand(2, 23) + 1800
    reference = transformers.AutoModelForImageTextToText.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = forward_on_device(model[0].eval(), tokens, positions, mask)
        expected = hf_logits(reference, model[0], tokens, positions)
    torch.testing.assert_close(logits, expected, atol=logits_atol(model[0], bridge.hf_config), rtol=0)
    exported, untrained = dict(export_hf_weights(bridge, model)), dict(untrained_hf_weights(bridge))
    stored = safetensors_of(hf_dir)
    assert not untrained and any(name.startswith("model.visual.") for name in exported)
    assert sorted(exported) == sorted(stored)
    for name, tensor in {**exported, **untrained}.items():
        got = tensor.cpu()
        assert got.dtype == stored[name].dtype and torch.equal(got, stored[name]), mismatch(name, got, stored[name])


def test_published_minimax_m2_config_builds_its_megatron_config(tmp_path: Path, megatron_world) -> None:
    """MiniMax-M2's config.json as published (custom config code, rotary_dim, FP8): the Megatron model it describes."""
    from slime_like.trainer.megatron.model import make_bridge
    from tools.reference_configs import write_reference_config

    bridge = make_bridge(write_reference_config("minimax-m2", tmp_path / "minimax-m2"), torch.bfloat16)
    config = bridge.config
    assert (config.num_layers, config.num_attention_heads, config.num_query_groups, config.kv_channels) == (
        62, 48, 8, 128
    )  # fmt: skip
    assert config.qk_layernorm and config.layernorm_epsilon == 1e-6 and not config.add_qkv_bias
    assert (config.num_moe_experts, config.moe_router_topk, config.moe_ffn_hidden_size) == (256, 8, 1536)
    assert config.moe_router_score_function == "sigmoid" and config.moe_router_enable_expert_bias
    assert config.moe_shared_expert_intermediate_size is None and config.moe_router_topk_scaling_factor is None
    rope = bridge._get_gptmodel_args()
    assert (rope["rotary_percent"], rope["rotary_base"], rope["vocab_size"]) == (0.5, 5000000, 200064)
