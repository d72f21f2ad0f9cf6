"""Families beyond Qwen/Llama served by a real SGLang CPU server: its fp32 log-probs equal Megatron's for the same
checkpoint, and after a training step and an in-place weight update (tensor, then distributed transport) they equal
Megatron's new ones and pass the run's weight check, so the export's names and layouts are the ones SGLang's loader
expects. Qwen3-VL-MoE's weight check probes with an image: its vision tower, deepstack and stacked experts (written in
the published layout SGLang's loader reads) are in the updates.

One server per family, all started at the beginning, each loading while the trainer builds its model. Families SGLang's CPU engine cannot serve are
listed in docs/models.md with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout.sglang_server import SGLangServer
from slime_like.trainer.weights.check import check_servers, served_logprobs
from tests.integration.test_weight_update import SEQUENCE, make_transport, train_one_step, trainable_engine
from tests.megatron.tiny_families import make_glm4, make_glm4_moe, make_mimo

TOLERANCE = 1e-4  # mean absolute log-prob difference, fp32 on both sides


def make_qwen3_vl_moe(out: Path, tokenizer_from: Path) -> Path:
    """tools/make_tiny_vlm.py's Qwen3-VL-MoE, untied as published (its own tokenizer and processor)."""
    from tools.make_tiny_vlm import make_tiny_vlm, parse_args

    return make_tiny_vlm(parse_args(["--out", str(out), "--family", "qwen3_vl_moe", "--no-tie-word-embeddings"]))


# family -> (tiny checkpoint maker, extra SGLang flags)
SERVED = {
    "glm4_moe": (make_glm4_moe, []),
    "glm4": (make_glm4, []),
    # MiMo's config is custom code, like the real checkpoint's: the server adds --trust-remote-code itself.
    "mimo": (make_mimo, []),
    "qwen3_vl_moe": (make_qwen3_vl_moe, []),
    # Not minimax_m2: SGLang 0.5.15's CPU engine dies at its first forward (a CUDA-only QK-norm kernel, docs/models.md).
    # Not glm_moe_dsa: SGLang's server arguments ask for the CUDA device capability of a DSA model (docs/models.md).
}


@pytest.fixture(scope="module")
def servers(
    tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, tuple[Path, SGLangServer]]]:
    """family -> (checkpoint, server), all started at once: later families load while earlier ones are tested."""
    logs = tmp_path_factory.mktemp("logs")
    started: dict[str, tuple[Path, SGLangServer]] = {}
    try:
        for family, (make, extra) in SERVED.items():
            hf_dir = make(tmp_path_factory.mktemp(f"tiny-{family}"), tiny_qwen3)
            server = SGLangServer(hf_dir, dtype="float32", log_dir=logs, startup_timeout=300, extra_args=extra)
            started[family] = (hf_dir, server.start(wait=False))
        yield started
    finally:
        for _, server in started.values():
            server.stop()


@pytest.mark.parametrize("family", sorted(SERVED))
def test_served_logprobs_match_megatron_before_and_after_an_update(family, servers, tmp_path) -> None:
    hf_dir, server = servers[family]
    engine = trainable_engine(hf_dir)  # built while the server loads
    server.wait_ready()
    before = served_logprobs(server.url, SEQUENCE)
    assert (before - engine.forward_logprobs([SEQUENCE])[0]).abs().mean() <= TOLERANCE
    # One update on each in-place transport, each after a training step, each checked as --check-weight-update does.
    for version, kind in enumerate(("tensor", "distributed"), start=1):
        train_one_step(engine)
        transport = make_transport(kind, [server.url], hf_dir, tmp_path / "weights", bucket_bytes=32 * 1024)
        try:
            transport.update(engine.export_hf_weights(), version)
        finally:
            transport.close()
        after = served_logprobs(server.url, SEQUENCE)
        assert (after - before).abs().max() > 1e-2, kind  # the weights really changed
        assert (after - engine.forward_logprobs([SEQUENCE])[0]).abs().mean() <= TOLERANCE, kind
        assert check_servers(engine, [server.url], 1e-4, rank=0, when=f"after the {kind} update") <= 1e-4
        before = after
