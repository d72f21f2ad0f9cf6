"""Failed weight updates: a server killed mid-update, and a server that stalls mid-broadcast. The trainer gets a
bounded failure with one log line per attempt, falls back to disk or retries later, and the servers end up with its
weights."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout.sglang_client import weight_version
from rollout.sglang_server import SGLangServer
from slime_like.core.errors import WeightUpdateError
from slime_like.trainer.weights.check import check_servers
from slime_like.trainer.weights.updater import WeightUpdater
from tests.integration.test_weight_update import engine, make_transport, start_servers, train_one_step  # noqa: F401

TIMEOUT = 8.0  # --update-weight-timeout of these updates: a stalled server costs this much per call


class Box:
    """One server that a test may kill and start again on the same port."""

    def __init__(self, model: Path, log_dir: Path) -> None:
        self.model, self.log_dir = model, log_dir
        self.server = start_servers(model, log_dir, 1)[0]

    @property
    def url(self) -> str:
        return self.server.url

    def restart(self) -> None:
        self.server.stop()
        self.server = SGLangServer(self.model, port=self.server.port, dtype="float32", log_dir=self.log_dir)
        self.server.start()

    def signal(self, sig: int) -> None:
        os.killpg(self.server.process.pid, sig)  # the server and its scheduler processes


@pytest.fixture(scope="module")
def box(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    holder = Box(tiny_qwen3, tmp_path_factory.mktemp("logs"))
    try:
        yield holder
    finally:
        holder.signal(signal.SIGCONT)  # never leave a stopped server behind
        holder.server.stop()


def updater_for(url: str, model: Path, directory: Path, primary: str, retries: int) -> WeightUpdater:
    factories = {
        kind: (lambda kind=kind: _transport(kind, url, model, directory)) for kind in ("distributed", "tensor", "disk")
    }
    return WeightUpdater(factories, primary, "disk", retries)


def _transport(kind: str, url: str, model: Path, directory: Path):
    transport = make_transport(kind, [url], model, directory)
    transport.timeout_s = TIMEOUT
    return transport


def export_then(engine, action, after: int = 3):  # noqa: F811 - the engine fixture is imported above
    """An export callable whose first export runs `action` once `after` tensors have been sent."""
    calls = []

    def export():
        calls.append(1)
        for i, item in enumerate(engine.export_hf_weights()):
            if i == after and len(calls) == 1:
                action()
            yield item

    return export


def test_killed_server_fails_every_attempt_then_a_retry_succeeds(box, engine, tiny_qwen3, tmp_path, caplog):  # noqa: F811
    updater = updater_for(box.url, tiny_qwen3, tmp_path / "weights", "tensor", retries=1)
    train_one_step(engine)
    start = time.monotonic()
    with caplog.at_level(logging.ERROR), pytest.raises(WeightUpdateError, match="weight update to version 1 failed"):
        updater.update(export_then(engine, lambda: box.signal(signal.SIGKILL)), 1)
    assert time.monotonic() - start < 60  # no hang: refused connections fail at once
    lines = [r.getMessage() for r in caplog.records if r.name == "slime_like.trainer.weights.updater"]
    assert len(lines) == 3, lines
    assert lines[0].startswith("weight update to version 1 over tensor failed (attempt 1 of 3)")
    assert lines[0].endswith("; retrying")
    assert lines[1].endswith("; falling back to disk") and lines[2].endswith("; giving up")
    # The server is back (same URL): the same updater retries and lands the weights.
    box.restart()
    assert updater.update(engine.export_hf_weights, 2) == "tensor"
    assert weight_version(box.url) == "2"
    assert check_servers(engine, [box.url], 1e-3, rank=0, when="after the update to version 2") < 1e-4
    updater.close()


def test_stalled_server_times_out_and_falls_back_to_disk(box, engine, tiny_qwen3, tmp_path, caplog):  # noqa: F811
    """SIGSTOP mid-broadcast: the distributed update times out; the server wakes up; the disk fallback lands."""
    updater = updater_for(box.url, tiny_qwen3, tmp_path / "weights", "distributed", retries=0)
    train_one_step(engine)

    def stall() -> None:
        box.signal(signal.SIGSTOP)
        threading.Timer(TIMEOUT + 4, box.signal, (signal.SIGCONT,)).start()

    start = time.monotonic()
    with caplog.at_level(logging.ERROR):
        assert updater.update(export_then(engine, stall), 3) == "disk"
    assert time.monotonic() - start < 120
    lines = [r.getMessage() for r in caplog.records if r.name == "slime_like.trainer.weights.updater"]
    assert len(lines) == 1 and "over distributed failed (attempt 1 of 2)" in lines[0], lines
    assert lines[0].endswith("; falling back to disk")
    assert weight_version(box.url) == "3"
    assert check_servers(engine, [box.url], 1e-3, rank=0, when="after the update to version 3") < 1e-4
    updater.close()
