"""Qwen3-MoE weight updates: after a distributed or tensor update, a server's log-probs equal those of a server that
loaded the trainer's exported checkpoint from disk (what a fresh start from that checkpoint loads), and the trainer's.

The model is untied, like every released Qwen3-MoE: SGLang's Qwen3-MoE ignores tie_word_embeddings and would serve
a tied checkpoint with an all-zero LM head (uniform log-probs).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from rollout.sglang_client import weight_version
from rollout.sglang_server import SGLangServer
from slime_like.trainer.weights.check import served_logprobs
from tests.integration.test_weight_update import SEQUENCE, make_transport, serve_two, train_one_step, trainable_engine


@pytest.fixture(scope="module")
def servers(tiny_qwen3_moe: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[SGLangServer]]:
    """The updated server and the reference one, both starting from the same checkpoint."""
    yield from serve_two(tiny_qwen3_moe, tmp_path_factory.mktemp("logs"))


@pytest.fixture(scope="module")
def engine(tiny_qwen3_moe: Path):
    return trainable_engine(tiny_qwen3_moe)


@pytest.mark.parametrize(("kind", "version"), [("distributed", 1), ("tensor", 2)])
def test_moe_update_equals_a_server_loading_the_export(kind, version, servers, engine, tiny_qwen3_moe, tmp_path):
    updated, reference = (s.url for s in servers)
    before = served_logprobs(updated, SEQUENCE)
    assert (before - engine.forward_logprobs([SEQUENCE])[0]).abs().max() < 1e-4
    train_one_step(engine)
    # Experts are many small tensors: small buckets make an update span many of them.
    for url, how in ((updated, kind), (reference, "disk")):
        transport = make_transport(how, [url], tiny_qwen3_moe, tmp_path / "weights", bucket_bytes=32 * 1024)
        try:
            transport.update(engine.export_hf_weights(), version)
        finally:
            transport.close()
    got, want = served_logprobs(updated, SEQUENCE), served_logprobs(reference, SEQUENCE)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert (got - before).abs().max() > 1e-2  # the weights really changed
    assert (got - engine.forward_logprobs([SEQUENCE])[0]).abs().max() < 1e-4
    assert weight_version(updated) == weight_version(reference) == str(version)
