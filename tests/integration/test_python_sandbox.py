"""The tool agent's Python sandbox: real child processes with limits, no network, killed on timeout."""

from __future__ import annotations

import asyncio
import time

import pytest

from plugins import tool_agent
from plugins.tools.python_sandbox import SandboxTimeout, network_namespace_prefix, run_python
from tests.unit.test_tools import fake_ctx


def test_python_sandbox_runs_code_with_limits() -> None:
    assert asyncio.run(run_python("print(sum(range(10)))")) == "exit status 0\n45\n"
    assert asyncio.run(run_python("raise SystemExit(3)")).startswith("exit status 3")
    # Memory above the limit fails inside the sandbox, not in the caller.
    assert "MemoryError" in asyncio.run(run_python("x = bytearray(1 << 30)", memory_mb=128))
    # Output is bounded and the writer stopped.
    out = asyncio.run(run_python("while True: print('y' * 100)", max_output=1000))
    assert out.endswith("[output truncated]") and len(out) < 1200


def test_python_sandbox_has_no_network() -> None:
    code = "import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 22))\nprint('connected')"
    out = asyncio.run(run_python(code))
    assert "connected" not in out and ("disabled in the sandbox" in out or "unreachable" in out)
    if network_namespace_prefix():  # with a private network namespace even the raw C socket is cut off
        out = asyncio.run(run_python("import _socket\n_socket.socket().connect(('127.0.0.1', 22))"))
        assert "Network is unreachable" in out


def test_python_sandbox_kills_code_that_loops_forever() -> None:
    start = time.monotonic()
    with pytest.raises(SandboxTimeout, match="timed out after 1s"):
        asyncio.run(run_python("import os\nos.fork()\nwhile True: pass", timeout=1.0))
    assert time.monotonic() - start < 5


def test_python_tool_call_that_loops_is_cut_off_and_counted() -> None:
    ctx = fake_ctx()
    text = '{"name": "python", "arguments": {"code": "while True: pass"}}'
    out = asyncio.run(tool_agent.run_tool_call(ctx, text, tool_agent.TOOLS))
    assert out.startswith("error: python code")
    assert ctx.counters == {"agent_tool_calls": 1, "agent_tool_timeouts": 1}
