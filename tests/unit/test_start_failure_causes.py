"""scripts/bench/bench_starts.py counts failed starts by cause: the messages the project's start-up code raises."""

from __future__ import annotations

import importlib.util
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO_ROOT


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_starts", REPO_ROOT / "scripts" / "bench" / "bench_starts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_starts", module)
    spec.loader.exec_module(module)
    return module


bench = _bench()


def test_a_server_that_could_not_bind_is_a_port_race() -> None:
    text = (
        "ProcessStartError: SGLang server (port 23456) exited with code 1 before http://127.0.0.1:23456/health "
        "answered 200 (healthy) (after 9.1s).\ncommand: python -m sglang.launch_server --watchdog-timeout 300\n"
        "--- last 40 lines of the log ---\n[2026-11-28] server_args=ServerArgs(api_key='x', watchdog_timeout=300)\n"
        "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 23456): address already in use"
    )
    cause, line = bench.classify(text)
    assert cause == bench.PORT_RACE
    assert "Errno 98" in line


def test_the_project_s_own_port_errors_are_port_races() -> None:
    assert bench.classify("PortInUseError: port 21000 on 127.0.0.1 is already in use (Address in use)")[0] == (
        bench.PORT_RACE
    )
    assert bench.classify("PortInUseError: no free port found on 127.0.0.1 in [20000, 32000)")[0] == bench.PORT_RACE


def test_a_start_that_gave_up_waiting_is_a_timeout_whatever_its_log_says() -> None:
    text = (
        "ProcessStartError: SGLang server (port 2) did not become healthy: http://127.0.0.1:2/health gave no 200 "
        "within 180s (after 180.2s).\n--- last 40 lines of the log ---\nGET /health 401 Unauthorized"
    )
    assert bench.classify(text)[0] == bench.TIMEOUT
    assert bench.classify("GetTimeoutError: Get timed out: some object(s) not ready.")[0] == bench.TIMEOUT


def test_a_refused_key_is_an_auth_failure_and_arguments_in_a_log_are_not() -> None:
    assert bench.classify("RuntimeError: POST http://127.0.0.1:3/generate answered 401: Unauthorized")[0] == (
        bench.AUTH
    )
    cause, line = bench.classify(
        "exit status 1\nserver_args=ServerArgs(api_key='k', watchdog_timeout=300)\nValueError: bad model path"
    )
    assert (cause, line) == (bench.OTHER, "ValueError: bad model path")


def test_other_failures_keep_their_message() -> None:
    assert bench.classify("exit status -9\nloading weights\n") == (bench.OTHER, "exit status -9")
    assert bench.classify("") == (bench.OTHER, "no output")


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 21)]  # 1..20
    assert bench.percentile(values, 50) == 10.0
    assert bench.percentile(values, 95) == 19.0
    assert bench.percentile([3.0], 95) == 3.0
    assert bench.time_figures([]) == "no values"


def test_a_tally_counts_failures_by_cause() -> None:
    tally = bench.Tally("engine")
    tally.add(bench.Start("engine", 0, ok=True, times={"ready": 10.0}))
    tally.add(bench.Start("engine", 1, cause=bench.PORT_RACE, message="address already in use"))
    summary = tally.summary()
    assert summary["starts"] == 2 and summary["failures"] == 1
    assert summary["by_cause"] == {bench.PORT_RACE: 1, bench.TIMEOUT: 0, bench.AUTH: 0, bench.OTHER: 0}
    assert summary["times"]["ready"].startswith("median 10.0 s")


def test_sglang_s_rendezvous_port_is_drawn_below_the_ephemeral_range(tmp_path: Path) -> None:
    from rollout.sglang_server import NCCL_PORT_FLAG, SGLangServer
    from slime_like.core.process import LISTEN_PORTS

    server = SGLangServer(tmp_path, port=30000, device="cpu", api_key="")
    cmd, _ = server.command()
    port = int(cmd[cmd.index(NCCL_PORT_FLAG) + 1])
    assert LISTEN_PORTS[0] <= port < LISTEN_PORTS[1] and port != 30000
    assert server.command()[0] == cmd  # drawn once: a retried command line is the same
    own, _ = SGLangServer(
        tmp_path, port=30000, device="cpu", api_key="", extra_args=[NCCL_PORT_FLAG, "21000"]
    ).command()
    assert own.count(NCCL_PORT_FLAG) == 1 and own[own.index(NCCL_PORT_FLAG) + 1] == "21000"


def test_freeze_gc_sends_the_server_s_own_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server started with its own key (SGLangServer(api_key=...)) is asked with that key, not the run's."""
    from rollout.sglang_client import freeze_gc

    seen: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            seen.append(self.headers.get("Authorization"))
            ok = self.headers.get("Authorization") == "Bearer own"
            body = b"{}" if ok else b'{"error":"Unauthorized"}'
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    monkeypatch.setenv("SLIME_LIKE_API_KEY", "the-run-s")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert freeze_gc(url, api_key="own") is True
        assert freeze_gc(url) is False  # the run's secret: refused, a warning, not an error
    finally:
        server.shutdown()
        server.server_close()
    assert seen == ["Bearer own", "Bearer the-run-s"]


def test_a_drawn_port_taken_before_its_check_is_drawn_again(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import socket

    from rollout import sglang_server

    # A listener on the first port the draw returns: the server must not fail its start on it, but draw again.
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    draws = iter([taken.getsockname()[1]])
    real = sglang_server.free_port
    monkeypatch.setattr(sglang_server, "free_port", lambda host: next(draws, None) or real(host))
    with taken:
        port = sglang_server.SGLangServer(str(tmp_path))._drawn_port()
        assert port != taken.getsockname()[1]
        sglang_server.check_port_free("127.0.0.1", port)
