"""In-place weight updates into two SGLang servers: after each transport, their log-probs equal Megatron's for the new
weights; generation is paused (in-flight requests aborted) and continues after; the post-update check catches a
server that does not hold the trainer's weights."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import torch

from rollout.sglang_client import generate, served_dtype, weight_version
from rollout.sglang_server import SGLangServer
from slime_like.core.errors import WeightUpdateError
from slime_like.trainer.weights.check import check_servers, served_logprobs
from slime_like.trainer.weights.disk import DiskTransport
from slime_like.trainer.weights.distributed import DistributedTransport
from slime_like.trainer.weights.tensor import TensorTransport, serialize_bucket
from slime_like.trainer.weights.updater import WeightUpdater

SEQUENCE = [287, 285, 224, 20, 21, 295, 224, 22, 23, 24, 34, 290, 29, 224, 22, 24, 26]
TOLERANCE = 1e-4  # fp32 on both sides; measured ~1e-6
VERSIONS = itertools.count(1)


def start_servers(model: Path, log_dir: Path, count: int) -> list[SGLangServer]:
    """Start `count` fp32 servers on `model` side by side (they load in parallel)."""
    servers = [SGLangServer(model, dtype="float32", log_dir=log_dir, startup_timeout=300) for _ in range(count)]
    try:
        for server in servers:
            server.start(wait=False)
        for server in servers:
            server.wait_ready()
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


def serve_two(model: Path, log_dir: Path) -> Iterator[list[SGLangServer]]:
    """Two servers of a module's own on `model` (its tests change their weights), stopped at the end."""
    started = start_servers(model, log_dir, 2)
    try:
        yield started
    finally:
        for server in started:
            server.stop()


def trainable_engine(model: Path):
    """A single-rank Megatron engine on `model`, with a large learning rate so one step moves every weight."""
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.optimizer import OptimizerSettings
    from slime_like.trainer.megatron.parallel import init_parallel

    init_parallel(tp=1, pp=1, seed=1234)
    return MegatronTrainEngine(model, OptimizerSettings(lr=3e-2, use_distributed_optimizer=False))


@pytest.fixture(scope="module")
def servers(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[SGLangServer]]:
    """Two servers on the tiny Qwen3."""
    yield from serve_two(tiny_qwen3, tmp_path_factory.mktemp("logs"))


@pytest.fixture(scope="module")
def engine(tiny_qwen3: Path):
    """The trainer on the same checkpoint."""
    return trainable_engine(tiny_qwen3)


def train_one_step(engine) -> None:
    """One cross-entropy step on SEQUENCE: moves every weight."""
    seq = torch.tensor(SEQUENCE)
    engine.train_step([seq], [None], lambda lps, data: -lps[0].mean())


def make_transport(kind: str, urls: list[str], model: Path, directory: Path, bucket_bytes: int = 64 * 1024):
    """One transport of each kind; small buckets, so an update spans many of them."""
    if kind == "distributed":
        return DistributedTransport(urls, bucket_bytes, timeout_s=60)
    if kind == "tensor":
        return TensorTransport(urls, bucket_bytes, timeout_s=60)
    return DiskTransport(urls, bucket_bytes, str(model), str(directory), timeout_s=60)


def test_check_names_precision_when_a_server_runs_at_another(engine, tiny_qwen3, tmp_path) -> None:
    """A server started with SGLang's --dtype float16 (what 'auto' picks for an fp32 checkpoint) fails the check
    before the first rollout, and the message says why: the two precisions. First in this file: the engine
    still holds the checkpoint's weights, so precision is the only difference."""
    with SGLangServer(tiny_qwen3, dtype="float16", log_dir=tmp_path) as half:
        assert served_dtype(half.url) == "float16"
        with pytest.raises(WeightUpdateError) as error:
            check_servers(engine, [half.url], 1e-5, rank=0, when="before the first rollout")
    message = str(error.value)
    assert message.startswith(f"before the first rollout, {half.url} differs from the trainer by")
    assert "the server runs in float16 but the trainer in float32: start the servers at the trainer's" in message


@pytest.mark.parametrize("kind", ["distributed", "tensor", "disk"])
def test_update_moves_servers_to_trainer_weights(kind, servers, engine, tmp_path, tiny_qwen3) -> None:
    urls = [s.url for s in servers]
    before = served_logprobs(urls[0], SEQUENCE)
    assert (before - engine.forward_logprobs([SEQUENCE])[0]).abs().max() < TOLERANCE
    train_one_step(engine)
    expected = engine.forward_logprobs([SEQUENCE])[0]
    transport = make_transport(kind, urls, tiny_qwen3, tmp_path / "weights")
    version = next(VERSIONS)
    try:
        transport.update(engine.export_hf_weights(), version)
    finally:
        transport.close()
    for url in urls:
        after = served_logprobs(url, SEQUENCE)
        assert (after - expected).abs().max() < TOLERANCE, url
        assert (after - before).abs().max() > 1e-2  # the weights really changed
        assert weight_version(url) == str(version)


@pytest.mark.parametrize("kind", ["distributed", "tensor"])
def test_one_transport_keeps_servers_current_over_updates(kind, servers, engine, tmp_path, tiny_qwen3) -> None:
    """Three train-then-update rounds on one transport: the tensor transport shares parameters once and,
    from the second update on, copies conversion temporaries (q/k/v) into reused staging tensors."""
    urls = [s.url for s in servers]
    transport = make_transport(kind, urls, tiny_qwen3, tmp_path / "weights")
    try:
        for _ in range(3):
            train_one_step(engine)
            expected = engine.forward_logprobs([SEQUENCE])[0]
            transport.update(engine.export_hf_weights(), next(VERSIONS))
            for url in urls:
                assert (served_logprobs(url, SEQUENCE) - expected).abs().max() < TOLERANCE, url
        if kind == "tensor":
            assert any(name.endswith("self_attn.q_proj.weight") for name in transport._staging)
    finally:
        transport.close()


def test_update_aborts_in_flight_generation_and_continues(servers, engine, tiny_qwen3, tmp_path) -> None:
    """A long request running when the update starts is aborted (returns what it has); generation works after."""
    url = servers[0].url
    answers: list = []
    long_request = threading.Thread(
        target=lambda: answers.append(
            generate(url, SEQUENCE, {"max_new_tokens": 1500, "ignore_eos": True, "temperature": 0}, timeout=300)
        )
    )
    long_request.start()
    for _ in range(300):  # wait until the server runs it
        if _running_requests(url):
            break
        time.sleep(0.1)
    assert _running_requests(url) == 1
    train_one_step(engine)
    transport = make_transport("tensor", [url], tiny_qwen3, tmp_path)
    try:
        transport.update(engine.export_hf_weights(), next(VERSIONS))
    finally:
        transport.close()
    long_request.join(timeout=120)
    assert answers and answers[0]["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(answers[0]["output_ids"]) < 1500
    after = generate(url, SEQUENCE, {"max_new_tokens": 4, "temperature": 0})
    assert after["meta_info"]["finish_reason"]["type"] == "length"
    assert (served_logprobs(url, SEQUENCE) - engine.forward_logprobs([SEQUENCE])[0]).abs().max() < TOLERANCE


def _running_requests(url: str) -> int:
    """Requests the server is running or queueing."""
    return sum(load["num_reqs"] for load in requests.get(f"{url}/get_load", timeout=10).json())


def test_check_passes_after_an_update_and_catches_a_stale_server(servers, engine, tiny_qwen3, tmp_path) -> None:
    urls = [s.url for s in servers]
    factories = {"tensor": lambda: make_transport("tensor", urls, tiny_qwen3, tmp_path)}
    updater = WeightUpdater(factories, "tensor", fallback=None, retries=0)
    train_one_step(engine)
    version = next(VERSIONS)
    assert updater.update(engine.export_hf_weights, version) == "tensor"
    when = f"after the update to version {version}"
    assert check_servers(engine, urls, 1e-3, rank=0, when=when) < 1e-4
    train_one_step(engine)  # the servers now hold stale weights
    with pytest.raises(WeightUpdateError, match=rf"{when}, {urls[0]} differs") as error:
        check_servers(engine, urls, 1e-3, rank=0, when=when)
    assert "both run in float32: the server does not hold the trainer's weights" in str(error.value)
    updater.close()


def test_distributed_transport_reconnects(servers, engine) -> None:
    """connect() twice (as after a failure) builds a fresh group; the update still lands."""
    urls = [s.url for s in servers]
    transport = DistributedTransport(urls, bucket_bytes=1 << 20, timeout_s=60)
    try:
        transport.connect()
        transport.connect()
        train_one_step(engine)
        transport.update(engine.export_hf_weights(), next(VERSIONS))
    finally:
        transport.close()
    for url in urls:
        assert (served_logprobs(url, SEQUENCE) - engine.forward_logprobs([SEQUENCE])[0]).abs().max() < TOLERANCE


def test_tensor_payload_is_sglang_flattened_bucket() -> None:
    """SGLang's own unpickler and FlattenedTensorBucket rebuild the tensors of our payload."""
    import base64

    from sglang.srt.utils.common import SafeUnpickler
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

    from slime_like.trainer.weights.base import flat_size, flatten_into

    torch.multiprocessing.set_sharing_strategy("file_system")
    tensors = [("w", torch.randn(3, 5)), ("b", torch.randn(7, dtype=torch.bfloat16))]
    buffer = torch.empty(flat_size(tensors, 64), dtype=torch.uint8).share_memory_()
    payload = serialize_bucket(*flatten_into(tensors, buffer, 64))
    import io

    data = SafeUnpickler(io.BytesIO(base64.b64decode(payload))).load()
    bucket = FlattenedTensorBucket(flattened_tensor=data["flattened_tensor"], metadata=data["metadata"])
    for (name, tensor), (got_name, got) in zip(tensors, bucket.reconstruct_tensors(), strict=True):
        assert got_name == name and torch.equal(got, tensor)


def test_trainer_rank_updates_with_flags_and_checks(servers, tiny_qwen3, tmp_path, monkeypatch, caplog) -> None:
    """TrainActor.update_weights as the loop calls it: --update-weight-transport tensor --check-weight-update.

    Last in this file: the actor's own engine replaces the servers' weights.
    """
    import logging
    import os

    from slime_like.trainer.actor import TrainActor
    from tests.megatron.algo_common import actor_args, make_data

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, os.environ.get(key, "0"))  # TrainActor sets them; restored after the test
    flags = ["--update-weight-transport", "tensor", "--check-weight-update", "--update-weight-buffer-size", "65536"]
    actor = TrainActor(actor_args(tiny_qwen3, flags), 0, "127.0.0.1", 0)
    actor.train(0, make_data())
    urls = [s.url for s in servers]
    with caplog.at_level(logging.INFO, logger="slime_like.trainer.actor"):
        assert actor.update_weights(urls, 100, "tensor", str(tmp_path)) > 0
    assert "weight version 100 over tensor: servers match the trainer within" in caplog.text
    assert all(weight_version(url) == "100" for url in urls)
    with pytest.raises(ValueError, match="weight version 100 is not above the current one"):
        actor.update_weights(urls, 100, "tensor", str(tmp_path))
