"""GLM-5 (glm_moe_dsa): megatron-core's DSA sparse attention on CPU against transformers' GlmMoeDsa, below and above
the indexer's top-k; bit-exact export; packed rows; a training step; the published config's Megatron config."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.megatron.tiny_families import make_glm_moe_dsa

TOPK = 6  # the tiny checkpoint's index_topk


@pytest.fixture(scope="module")
def tiny_glm_moe_dsa(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_glm_moe_dsa(tmp_path_factory.mktemp("tiny-glm-moe-dsa"), tiny_qwen3)


@pytest.fixture(scope="module")
def megatron_glm5(tiny_glm_moe_dsa: Path, megatron_world):
    from slime_like.trainer.megatron.model import build_model, load_hf_weights, make_bridge

    bridge = make_bridge(tiny_glm_moe_dsa, torch.float32)
    model = build_model(bridge, wrap_with_ddp=False)
    load_hf_weights(bridge, model, tiny_glm_moe_dsa)
    return bridge, model


def _causal(n: int) -> torch.Tensor:
    return ~torch.ones(n, n, dtype=torch.bool).tril()


def _indexers(model) -> list:
    return [layer.self_attention.core_attention.indexer for layer in model[0].decoder.layers]


@pytest.mark.parametrize("length", [5, 23], ids=["dense-below-topk", "sparse-above-topk"])
def test_logits_match_transformers(length: int, tiny_glm_moe_dsa: Path, megatron_glm5) -> None:
    import transformers

    _, model = megatron_glm5
    tokens = torch.randint(0, 512, (2, length), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(length)[None].expand(2, length)
    mask = _causal(length)[None, None].expand(2, 1, length, length)
    # eager: transformers' SDPA path passes no mask to the indexer (it then masks by position ids alone).
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        tiny_glm_moe_dsa, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    m = model[0].eval()
    with torch.no_grad():
        logits = m(tokens, positions, mask)
        expected = reference(tokens, position_ids=positions).logits
        for indexer in _indexers(model):  # every key kept: the dense MLA the sparse attention must differ from
            indexer.index_topk = 10**6
        dense = m(tokens, positions, mask)
        for indexer in _indexers(model):
            indexer.index_topk = TOPK
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)
    gap = (dense - logits).abs().max().item()
    assert (gap > 1e-3) if length > TOPK else (gap == 0.0), gap  # top-k sparsifies only past index_topk keys


def test_export_is_bit_exact(tiny_glm_moe_dsa: Path, megatron_glm5) -> None:
    from safetensors.torch import load_file

    from slime_like.trainer.megatron.model import export_hf_weights, untrained_hf_weights

    bridge, model = megatron_glm5
    exported, untrained = dict(export_hf_weights(bridge, model)), dict(untrained_hf_weights(bridge))
    stored = load_file(tiny_glm_moe_dsa / "model.safetensors")
    assert untrained and all(name.startswith("model.layers.3.") for name in untrained)  # the MTP layer, as stored
    assert any(".indexer.wq_b." in name for name in exported)
    assert sorted(exported) == sorted(set(stored) - set(untrained))
    for name, tensor in {**exported, **untrained}.items():
        assert torch.equal(tensor, stored[name]), name


def test_packed_sequences_match_separate_forwards(megatron_glm5) -> None:
    """Two sequences in one row: neither the indexer nor the sparse attention looks across the block mask (both
    longer than top-k, so the first sequence's keys would be picked by the second's queries without it)."""
    _, model = megatron_glm5
    g = torch.Generator().manual_seed(2)
    first, second = torch.randint(0, 512, (1, 9), generator=g), torch.randint(0, 512, (1, 14), generator=g)
    mask = torch.ones(23, 23, dtype=torch.bool)
    mask[:9, :9], mask[9:, 9:] = _causal(9), _causal(14)
    m = model[0].eval()
    with torch.no_grad():
        alone = [m(t, torch.arange(t.shape[1])[None], _causal(t.shape[1])[None, None]) for t in (first, second)]
        positions = torch.cat([torch.arange(9), torch.arange(14)])[None]
        packed = m(torch.cat([first, second], 1), positions, mask[None, None])
    torch.testing.assert_close(packed[:, :9], alone[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(packed[:, 9:], alone[1], atol=1e-5, rtol=0)


def test_interleaved_indexer_rope_rotates_pairs() -> None:
    """indexer_rope_interleave (GLM-5, as SGLang reads it): each (even, odd) pair of the first qk_rope_head_dim
    dimensions turns by its frequency, up to an order q and k share; the rest of the head is untouched."""
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd

    from slime_like.trainer.megatron.dsa import HFLayoutIndexer

    g = torch.Generator().manual_seed(0)
    rope, dim, s = 8, 16, 5
    x = torch.randn(s, 1, 2, dim, generator=g)
    inv = 1.0 / 10000 ** (torch.arange(0, rope, 2).float() / rope)
    angles = torch.arange(s).float()[:, None] * inv[None]  # [s, rope / 2]
    freqs = torch.cat([angles, angles], -1)[:, None, None, :]
    stub = type("Stub", (), {"qk_pos_emb_head_dim": rope, "index_head_dim": dim, "rope_interleaved": True})()
    out = HFLayoutIndexer._apply_rope(stub, x, freqs, 1.0)
    even, odd = x[..., 0:rope:2], x[..., 1:rope:2]
    cos, sin = angles.cos()[:, None, None], angles.sin()[:, None, None]
    pairs = torch.cat([even * cos - odd * sin, odd * cos + even * sin], -1)  # GPT-J rotation, evens then odds
    torch.testing.assert_close(out[..., :rope], pairs, atol=1e-6, rtol=0)
    assert torch.equal(out[..., rope:], x[..., rope:])
    halves = _apply_rotary_pos_emb_bshd(x[..., :rope], freqs, rotary_interleaved=False)
    stub.rope_interleaved = False
    torch.testing.assert_close(HFLayoutIndexer._apply_rope(stub, x, freqs, 1.0)[..., :rope], halves)


def test_torch_hadamard_rotation_is_orthonormal() -> None:
    """The CPU stand-in for fast_hadamard_transform: x @ H / sqrt(d), H the Sylvester-Hadamard matrix."""
    from slime_like.trainer.megatron.dsa import torch_rotate_activation

    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    y = torch_rotate_activation(x)
    torch.testing.assert_close(y @ y.T, x @ x.T)  # dot products kept
    torch.testing.assert_close(y[:, 0] * 4, x.sum(-1))  # H's first column is all ones
    with pytest.raises(ValueError, match="power of two"):
        torch_rotate_activation(torch.randn(2, 12))


def test_glm5_trains(tiny_glm_moe_dsa: Path, megatron_world) -> None:
    """Optimizer steps on packed micro-batches: the loss falls and MLA weights move; the indexer, whose inputs are
    detached and whose KL loss is off, keeps its checkpoint weights."""
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.optimizer import OptimizerSettings
    from tests.megatron.common import fixed_batch, num_targets, token_ce_loss

    engine = MegatronTrainEngine(tiny_glm_moe_dsa, OptimizerSettings(lr=1e-2), max_tokens_per_micro_batch=40)
    seqs = fixed_batch()[:4]
    before = {name: t.clone() for name, t in engine.export_hf_weights()}
    losses = [engine.train_step(seqs, [None] * len(seqs), token_ce_loss(num_targets(seqs)))["loss"] for _ in range(2)]
    after = dict(engine.export_hf_weights())
    assert losses[1] < losses[0], losses
    assert not torch.equal(
        before["model.layers.1.self_attn.q_b_proj.weight"], after["model.layers.1.self_attn.q_b_proj.weight"]
    )
    indexer = [k for k in before if ".indexer." in k]
    assert indexer and all(torch.equal(before[k], after[k]) for k in indexer)


def test_published_glm5_config_builds_its_megatron_config(tmp_path: Path, megatron_world) -> None:
    """GLM-5's config.json: 78 MLA layers with a 32-head indexer picking 2048 keys, 3 dense layers, 256 experts."""
    from slime_like.trainer.megatron.model import make_bridge

    source = Path(__file__).parents[2] / "tools" / "hf_configs" / "glm5-744B-A40B.json"
    (tmp_path / "config.json").write_text(source.read_text())
    bridge = make_bridge(tmp_path, torch.bfloat16)
    config = bridge.config
    assert (config.experimental_attention_variant, config.dsa_indexer_topk) == ("dsa", 2048)
    assert (config.dsa_indexer_n_heads, config.dsa_indexer_head_dim) == (32, 128)
    assert (config.num_layers, config.q_lora_rank, config.kv_lora_rank, config.v_head_dim) == (78, 2048, 512, 256)
    assert config.moe_layer_freq == [0] * 3 + [1] * 75 and config.num_moe_experts == 256
    assert bridge.hf_config.indexer_rope_interleave is True


def test_shared_topk_layers_are_refused() -> None:
    """Cross-layer top-k sharing (index_topk_freq > 1) has no megatron-core module: refused, naming the layers."""
    from types import SimpleNamespace

    from slime_like.trainer.megatron.dsa import dsa_config_args

    hf = SimpleNamespace(num_hidden_layers=4, indexer_types=["full", "shared", "full", "shared"])
    with pytest.raises(ValueError, match=r"layers \[1, 3\] of the HF config reuse"):
        dsa_config_args(hf, torch.float32)


def test_selective_core_attention_recompute_is_refused(tiny_glm_moe_dsa: Path, megatron_world) -> None:
    """MLA's checkpointed core attention would call DSA without the indexer's inputs: refused, naming the flag."""
    from slime_like.trainer.megatron.model import make_bridge

    with pytest.raises(ValueError, match="--recompute-granularity selective with core_attn"):
        make_bridge(tiny_glm_moe_dsa, torch.float32, recompute_granularity="selective")


def test_interleaved_indexer_rope_matches_transformers_on_reordered_rows(
    tiny_qwen3: Path, tmp_path: Path, megatron_world
) -> None:
    """GLM-5's convention (indexer_rope_interleave: pairs, as SGLang runs it) against transformers, which rotates
    halves: transformers given each indexer head's rope rows reordered evens-then-odds rotates the same pairs."""
    import transformers

    from slime_like.trainer.megatron.model import build_model, load_hf_weights, make_bridge

    hf_dir = make_glm_moe_dsa(tmp_path / "interleaved", tiny_qwen3, rope_interleave=True)
    bridge = make_bridge(hf_dir, torch.float32)
    model = build_model(bridge, wrap_with_ddp=False)
    load_hf_weights(bridge, model, hf_dir)
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        hf_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    tokens = torch.randint(0, 512, (2, 23), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(23)[None].expand(2, 23)
    with torch.no_grad():
        logits = model[0].eval()(tokens, positions, _causal(23)[None, None].expand(2, 1, 23, 23))
        as_halves = reference(tokens, position_ids=positions).logits
        rope, dim = bridge.hf_config.qk_rope_head_dim, bridge.hf_config.index_head_dim
        order = torch.cat([torch.arange(0, rope, 2), torch.arange(1, rope, 2), torch.arange(rope, dim)])
        for layer in reference.model.layers:
            indexer = layer.self_attn.indexer
            heads = indexer.wq_b.weight.view(-1, dim, indexer.wq_b.weight.shape[-1])
            indexer.wq_b.weight.copy_(heads[:, order].reshape_as(indexer.wq_b.weight))
            for param in (indexer.wk.weight, indexer.k_norm.weight, indexer.k_norm.bias):
                param.copy_(param[order])
        as_pairs = reference(tokens, position_ids=positions).logits
    torch.testing.assert_close(logits, as_pairs, atol=1e-5, rtol=0)
    assert (logits - as_halves).abs().max() > 1e-3  # the convention picks other keys
