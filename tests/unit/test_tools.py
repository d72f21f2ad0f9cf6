"""The agent example's tools: the calculator and tool-call handling (the Python sandbox: tests/integration)."""

from __future__ import annotations

import asyncio
from argparse import Namespace

import pytest

from plugins import tool_agent
from plugins.tools.calculator import CalculatorError, calculator, evaluate
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
