"""The agent example's tools: the calculator, the Python sandbox's limits, and tool-call handling."""

from __future__ import annotations

import asyncio
import time
from argparse import Namespace

import pytest

from plugins import tool_agent
from plugins.tools.calculator import CalculatorError, calculator, evaluate
from plugins.tools.python_sandbox import SandboxTimeout, network_namespace_prefix, run_python
from rollout.context import RolloutContext


def test_calculator() -> None:
    assert evaluate("3 * (4 + 5) - 2 ** 3") == 19
    assert evaluate("7 / 2") == 3.5 and evaluate("-7 // 2") == -4 and evaluate("7 % 3") == 1
    assert asyncio.run(calculator({"expression": "10 / 4 * 2"})) == "5"
    for bad, message in [
        ("__import__('os')", "unsupported syntax"),
        ("2 ** 1000", "exponent"),
        ("1 / 0", "division by zero"),
        ("1 +", "not an arithmetic expression"),
        ("9" * 300, "longer than"),
    ]:
        with pytest.raises(CalculatorError, match=message):
            evaluate(bad)


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


def fake_ctx() -> RolloutContext:
    return RolloutContext(Namespace(), None, "", None, None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "counter", "observation"),
    [
        ('{"name": "calculator", "arguments": {"expression": "6*7"}}', None, "42"),
        ('{"name": "calculator", "arguments": {"expression": "6*"}}', "agent_tool_errors", "error: not an arith"),
        ("{name: calculator}", "agent_tool_call_malformed", "error: malformed tool call"),
        ('["calculator"]', "agent_tool_call_malformed", "error: malformed tool call"),
        ('{"name": "web", "arguments": {}}', "agent_tool_unknown", "error: unknown tool 'web'"),
        ('{"name": "python", "arguments": {"code": "while True: pass"}}', "agent_tool_timeouts", "error: python code"),
    ],
)
def test_tool_call_handling(text: str, counter: str | None, observation: str) -> None:
    ctx = fake_ctx()
    out = asyncio.run(tool_agent.run_tool_call(ctx, text, tool_agent.TOOLS))
    assert out.startswith(observation)
    assert ctx.counters == {"agent_tool_calls": 1, **({counter: 1} if counter else {})}


def test_a_tool_that_hangs_is_cut_off_by_the_backstop(monkeypatch: pytest.MonkeyPatch) -> None:
    async def hang(arguments: dict) -> str:
        await asyncio.sleep(60)
        return ""

    monkeypatch.setattr(tool_agent, "TOOL_TIMEOUT_S", 0.2)
    ctx = fake_ctx()
    out = asyncio.run(tool_agent.run_tool_call(ctx, '{"name": "hang"}', {"hang": hang}))
    assert out.startswith("error:") and ctx.counters["agent_tool_timeouts"] == 1
