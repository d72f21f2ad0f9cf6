"""Session-wide real SGLang servers on the tiny Qwen3 model: started once, always stopped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout.router import SGLangRouter
from rollout.sglang_server import SGLangServer


def _serve(model: Path, log_dir: Path) -> Iterator[SGLangServer]:
    """Start a fp32 CPU/GPU server, yield it, and stop it whatever the tests did."""
    # float32 so log-probs can be compared with a float32 transformers forward.
    server = SGLangServer(model, dtype="float32", log_dir=log_dir, startup_timeout=180)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def sglang_server(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangServer]:
    """One SGLang server on tiny_qwen3, shared by every integration test of the session."""
    yield from _serve(tiny_qwen3, tmp_path_factory.mktemp("sglang-logs"))


@pytest.fixture(scope="session")
def second_sglang_server(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangServer]:
    """A second server on the same model, started only when a test asks for two (router tests)."""
    yield from _serve(tiny_qwen3, tmp_path_factory.mktemp("sglang-logs-2"))


@pytest.fixture(scope="module")
def workers(sglang_server: SGLangServer, second_sglang_server: SGLangServer) -> list[SGLangServer]:
    """The session's two SGLang servers."""
    return [sglang_server, second_sglang_server]


@pytest.fixture(scope="module")
def router(workers: list[SGLangServer], tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangRouter]:
    """A round-robin router over both workers (the default cache_aware policy sends a quiet stream to one);
    one per test module, since router tests add and remove workers."""
    with SGLangRouter([w.url for w in workers], policy="round_robin", log_dir=tmp_path_factory.mktemp("router")) as r:
        yield r
