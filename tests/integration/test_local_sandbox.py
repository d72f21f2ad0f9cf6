"""The local sandbox for coding agents (plugins/local_sandbox.py): a per-sample copy, no network but the bridged
endpoint port, its limits, and nothing left running once it is closed."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from plugins import local_sandbox
from plugins.local_sandbox import Limits, LocalSandbox, SandboxError

pytestmark = pytest.mark.skipif(local_sandbox.check() is not None, reason=f"{local_sandbox.check()}")

PROBE = "python3 -c 'import socket,sys; s=socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3); print(\"reached\")' {} {} 2>&1 | tail -1"  # noqa: E501


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(f"hello from {self.path}".encode())

    def log_message(self, *args: object) -> None:
        pass


def _serve() -> tuple[ThreadingHTTPServer, int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (root / "test_calc.py").write_text(
        "import unittest\nfrom calc import add\n\nclass T(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
    )
    return root


@pytest.fixture
def servers() -> Iterator[tuple[int, int]]:
    """Two HTTP servers on this host's loopback: the one bridged in, and one that must stay out of reach."""
    (endpoint, port), (other, other_port) = _serve(), _serve()
    yield port, other_port
    endpoint.shutdown()
    other.shutdown()


def test_a_copy_of_the_repository_with_the_bridged_port_only(repo: Path, servers: tuple[int, int]) -> None:
    port, other_port = servers

    async def main() -> tuple[list, set[int]]:
        async with LocalSandbox(repo, workdir="/workspace/repo", bridge=[port]) as sb:
            results = [
                await sb.exec("python3 -m unittest 2>&1 | tail -1; echo 'return a + b' > calc.py"),
                await sb.exec(
                    f"python3 -c 'import urllib.request as u; print(u.urlopen(\"http://127.0.0.1:{port}/s/x\").read().decode())'"
                ),  # noqa: E501
                await sb.exec(PROBE.format("127.0.0.1", other_port)),  # the host's other server: not in its loopback
                await sb.exec(PROBE.format("1.1.1.1", 80)),
                await sb.exec("id -un; ls /work /root 2>&1 | wc -l; touch /usr/x /etc/x 2>&1 | wc -l; ls /tmp"),
            ]
            pids = sb.leftover_pids()
        return results, pids

    results, pids = asyncio.run(main())
    assert results[0][1].strip().splitlines()[0] == "FAILED (failures=1)"
    assert results[1][1].strip() == "hello from /s/x"
    assert "reached" not in results[2][1] and "Connection refused" in results[2][1]
    assert "reached" not in results[3][1] and "unreachable" in results[3][1]
    assert results[4][1].split() == ["agent", "2", "2"]  # no /work nor /root; /usr and /etc read-only; empty /tmp
    assert len(pids) >= 2  # its bwrap and init while it ran
    assert (repo / "calc.py").read_text() == "def add(a, b):\n    return a - b\n"  # the original is untouched


def test_everything_it_started_is_killed_at_the_end(repo: Path) -> None:
    async def main() -> tuple[LocalSandbox, int]:
        sb = LocalSandbox(repo)
        async with sb:
            # A daemon that left the command's session, and a loop that ignores SIGTERM.
            await sb.exec(
                "setsid sleep 1000 > /dev/null 2>&1 & (trap '' TERM; while :; do sleep 1; done) > /dev/null 2>&1 &"
            )  # noqa: E501
            await asyncio.sleep(0.3)
            running = len(sb.leftover_pids())
        return sb, running

    sb, running = asyncio.run(main())
    assert running >= 5  # bwrap, init, sleep 1000, the loop's shell and its sleep
    assert sb.leftover_pids() == set()
    assert sb.root is not None and not sb.root.exists()


def test_limits_memory_time_and_lifetime(repo: Path) -> None:
    async def main() -> tuple[tuple, tuple, float, str]:
        async with LocalSandbox(repo, limits=Limits(memory_mb=64, lifetime_s=3.0)) as sb:
            assert {"memory", "data"} & sb.limited
            memory = await sb.exec("python3 -c 'b = bytearray(400 << 20); print(len(b))'")
            start = time.monotonic()
            slow = await sb.exec("sleep 30", timeout=1)
            took = time.monotonic() - start
            await asyncio.sleep(3.0)  # past its lifetime: killed
            try:
                await sb.exec("true")
                after = "ran"
            except SandboxError as exc:
                after = str(exc)
        return memory, slow, took, after

    memory, slow, took, after = asyncio.run(main())
    assert memory[0] != 0 and "419430400" not in memory[1]  # killed (cgroup) or MemoryError (RLIMIT_DATA)
    assert slow[0] == local_sandbox.TIMEOUT_RC and took < 5
    assert "is not running" in after or "died" in after


def test_a_command_that_fails_with_check_says_why(repo: Path) -> None:
    async def main() -> str:
        async with LocalSandbox(repo) as sb:
            with pytest.raises(SandboxError, match="exit=3") as info:
                await sb.exec("echo boom >&2; exit 3", check=True)
            return str(info.value)

    assert "boom" in asyncio.run(main())


def test_a_sandbox_port_is_not_the_hosts(repo: Path) -> None:
    """A server the agent starts inside listens in the sandbox's namespace, not on this host."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def main() -> bool:
        async with LocalSandbox(repo) as sb:
            await sb.exec(f"python3 -m http.server {port} --bind 127.0.0.1 > /dev/null 2>&1 &")
            await asyncio.sleep(1.0)
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return False

    assert asyncio.run(main()) is False
