"""Megatron GPTModel built from tiny HF checkpoints through mbridge matches transformers, and exports back."""

from __future__ import annotations

import pytest
import torch

from tests.megatron.common import forward_on_device

MODELS = ["tiny_qwen3", "tiny_qwen2_untied"]  # tied first: mbridge used to leak the tied mapping


def _hf_model(hf_dir):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()


def _megatron_model(hf_dir):
    from slime_like.trainer.megatron.model import build_model, load_hf_weights, make_bridge

    bridge = make_bridge(hf_dir, torch.float32)
    model = build_model(bridge, wrap_with_ddp=False)
    load_hf_weights(bridge, model, hf_dir)
    return bridge, model


@pytest.mark.parametrize("fixture", MODELS)
def test_logits_match_transformers(fixture, request, megatron_world):
    hf_dir = request.getfixturevalue(fixture)
    _, model = _megatron_model(hf_dir)
    tokens = torch.randint(0, 512, (2, 23), generator=torch.Generator().manual_seed(1))
    mask = ~torch.ones(23, 23, dtype=torch.bool).tril()[None, None].expand(2, 1, 23, 23)
    positions = torch.arange(23)[None].expand(2, 23)
    with torch.no_grad():
        logits = forward_on_device(model[0].eval(), tokens, positions, mask)
        expected = _hf_model(hf_dir)(tokens).logits
    assert logits.shape == expected.shape
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("fixture", MODELS)
def test_export_round_trip_is_bit_exact(fixture, request, megatron_world):
    from slime_like.trainer.megatron.model import export_hf_weights

    hf_dir = request.getfixturevalue(fixture)
    bridge, model = _megatron_model(hf_dir)
    hf = _hf_model(hf_dir)
    expected = hf.state_dict()
    if hf.config.tie_word_embeddings:
        expected.pop("lm_head.weight")  # an alias of the embedding, exported once
    exported = dict(export_hf_weights(bridge, model))
    assert sorted(exported) == sorted(expected)
    for name, tensor in exported.items():
        assert tensor.dtype == expected[name].dtype and torch.equal(tensor.cpu(), expected[name]), name
