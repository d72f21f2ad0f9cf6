"""Session-wide real SGLang servers on the tiny Qwen3 model: started once, always stopped. One real run that two
modules read."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from rollout.router import SGLangRouter
from rollout.sglang_server import SGLangServer
from tests.conftest import REPO_ROOT
from tests.integration.two_engine_job import delta_flags, job, write_task


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


@pytest.fixture(scope="session")
def long_tiny_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3 with a 32k context and a chat template that renders tools (Qwen's shape): for coding agents."""
    from tests.conftest import _make_tiny
    from tests.integration.test_openai_endpoint import TOOLS_TEMPLATE

    model = _make_tiny(tmp_path_factory, "qwen3", max_position_embeddings=32768)
    (model / "chat_template.jinja").write_text(TOOLS_TEMPLATE)
    return model


@pytest.fixture(scope="session")
def long_sglang_server(long_tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangServer]:
    """A server on long_tiny_qwen3 with room for coding agents' long prompts (test_coding_agents.py,
    test_coding_agent_rl.py)."""
    server = SGLangServer(
        long_tiny_qwen3, dtype="float32", log_dir=tmp_path_factory.mktemp("long-logs"), startup_timeout=240,
        max_total_tokens=65536,
    )  # fmt: skip
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pause_server(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangServer]:
    """A server with the flags every --pause-generation-mode needs (rollout/pause.py: retract's and in_place's; the
    session's first server has none of them), shared by test_delta_weight_sync.py, test_fully_async.py and
    test_pause_modes.py. Its weights and version change: each test reads them from the server, or sets them, before
    it relies on them."""
    from rollout.pause import server_args

    flags = sorted(set(server_args("retract") + server_args("in_place")))
    server = SGLangServer(tiny_qwen3, dtype="float32", extra_args=flags, log_dir=tmp_path_factory.mktemp("pause-logs"))
    try:
        yield server.start()
    finally:
        server.stop()


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


@pytest.fixture(scope="session")
def delta_run_on_one_node(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """The two-engine job (two_engine_job.py) on one node, a local Ray instance, with slime's delta weight flags.
    test_delta_weight_sync.py checks the deltas; test_multinode.py checks that the simulated cluster's run of the same
    job logs the same numbers (every transport must deliver the same weights: the weight check holds both to it). A
    run's start-up is most of its cost: one run for both."""
    root = tmp_path_factory.mktemp("delta-run")
    task = write_task(root)
    shared, local, out = root / "shared", root / "nvme", root / "out"
    env = {**os.environ, "PYTHONPATH": f"{task}:{REPO_ROOT}", "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    cmd = job(tiny_qwen3, task, out, *delta_flags(shared, local))
    proc = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return SimpleNamespace(out=out, shared=shared, local=local, output=proc.stdout + proc.stderr)
