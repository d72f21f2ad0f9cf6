"""A verifiers environment (prime-rl's library) for plugins/verifiers_env.py: double a digit with a tool.

Loaded by verifiers' `load_environment("plugins.verifiers_double_env", max_turns=...)` in .venv-verifiers (it
imports verifiers, which the rollout's venv does not have). A `ToolEnv` with one Python tool, `double`; the rubric
gives 1.0 for the right final answer and 0.5 for having called the tool on the question's digit (its result is the
answer), weighted sum.
"""

from __future__ import annotations

from typing import Any

import verifiers as vf
from datasets import Dataset

DIGITS = (1, 2, 3, 4)


def double(digit: str) -> str:
    """Twice the digit.

    Args:
        digit: the digit to double
    """
    return str(2 * int(digit))


def _field(message: Any, key: str) -> Any:
    return message[key] if isinstance(message, dict) else getattr(message, key, None)


def correct_answer(completion: list[Any], answer: str, **_: Any) -> float:
    """1.0 when the last message is the model's and says the answer."""
    last = completion[-1] if completion else None
    return float(
        last is not None and _field(last, "role") == "assistant" and (_field(last, "content") or "").strip() == answer
    )


def used_the_tool(completion: list[Any], answer: str, **_: Any) -> float:
    """1.0 when a tool result is the answer: the model called `double` on the question's digit."""
    return float(any(_field(m, "role") == "tool" and str(_field(m, "content")).strip() == answer for m in completion))


def load_environment(max_turns: int = 3) -> vf.Environment:
    """The environment: "Double d." for each digit, the answer 2d."""
    rows = [{"question": f"Double {d} with the double tool, then answer with the result only.", "answer": str(2 * d)}
            for d in DIGITS]  # fmt: skip
    rubric = vf.Rubric(funcs=[correct_answer, used_the_tool], weights=[1.0, 0.5])
    return vf.ToolEnv(dataset=Dataset.from_list(rows), tools=[double], max_turns=max_turns, rubric=rubric)
