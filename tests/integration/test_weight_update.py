"""In-place weight updates: after each transport, SGLang's log-probs equal Megatron's for the new weights."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import torch

from rollout.sglang_server import SGLangServer, generate
from slime_like.weights.disk import DiskTransport
from slime_like.weights.distributed import DistributedTransport

pytestmark = pytest.mark.integration

SEQUENCE = [287, 285, 224, 20, 21, 295, 224, 22, 23, 24, 34, 290, 29, 224, 22, 24, 26]
TOLERANCE = 1e-4  # fp32 on both sides; measured ~1e-6


@pytest.fixture(scope="module")
def server(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangServer]:
    """A server of our own: these tests change its weights."""
    srv = SGLangServer(tiny_qwen3, dtype="float32", log_dir=tmp_path_factory.mktemp("logs"))
    try:
        yield srv.start()
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def engine(tiny_qwen3: Path):
    """A single-rank Megatron engine on the same checkpoint, with a large learning rate."""
    from slime_like.megatron.engine import MegatronTrainEngine
    from slime_like.megatron.optimizer import OptimizerSettings
    from slime_like.megatron.parallel import init_parallel

    init_parallel(tp=1, pp=1, seed=1234)
    return MegatronTrainEngine(tiny_qwen3, OptimizerSettings(lr=3e-2, use_distributed_optimizer=False))


def served_logprobs(url: str) -> torch.Tensor:
    """The server's log-prob of every token of SEQUENCE after the first."""
    meta = generate(url, SEQUENCE, {"max_new_tokens": 1, "temperature": 0}, return_logprob=True, logprob_start_len=0)
    return torch.tensor([lp for lp, _, _ in meta["meta_info"]["input_token_logprobs"][1:]])


def train_one_step(engine) -> None:
    """One cross-entropy step on SEQUENCE: moves every weight."""
    seq = torch.tensor(SEQUENCE)
    engine.train_step([seq], [None], lambda lps, data: -lps[0].mean())


def weight_version(url: str) -> str:
    return requests.get(f"{url}/model_info", timeout=10).json()["weight_version"]


@pytest.mark.parametrize("kind", ["distributed", "disk"])
def test_update_moves_server_to_trainer_weights(
    kind: str, server: SGLangServer, engine, tmp_path: Path, tiny_qwen3: Path
) -> None:
    before = served_logprobs(server.url)
    megatron_before = engine.forward_logprobs([SEQUENCE])[0]
    assert (before - megatron_before).abs().max() < TOLERANCE
    train_one_step(engine)
    expected = engine.forward_logprobs([SEQUENCE])[0]
    # Small buckets: the update must work across many of them.
    if kind == "distributed":
        transport = DistributedTransport([server.url], bucket_bytes=64 * 1024)
    else:
        transport = DiskTransport([server.url], 64 * 1024, str(tiny_qwen3), str(tmp_path / "weights"))
    version = 7 if kind == "disk" else 3
    try:
        transport.send(engine.export_hf_weights(), version)
    finally:
        transport.close()
    after = served_logprobs(server.url)
    assert (after - expected).abs().max() < TOLERANCE
    assert (after - before).abs().max() > 1e-2  # the weights really changed
    assert weight_version(server.url) == str(version)


def test_distributed_transport_reconnects(server: SGLangServer, engine) -> None:
    """connect() twice (as after a failure) builds a fresh group; the update still lands."""
    transport = DistributedTransport([server.url], bucket_bytes=1 << 20)
    try:
        transport.connect()
        transport.connect()
        train_one_step(engine)
        transport.send(engine.export_hf_weights(), 11)
    finally:
        transport.close()
    assert (served_logprobs(server.url) - engine.forward_logprobs([SEQUENCE])[0]).abs().max() < TOLERANCE
