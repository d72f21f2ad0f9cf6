"""Reward functions chosen by `--rm-type` (or `--custom-rm-path`), and safe per-sample scoring."""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
from collections.abc import Callable
from typing import Any

from slime_like.sample import Sample, Status

logger = logging.getLogger(__name__)

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def extract_answer(text: str) -> str | None:
    """The final answer: the last \\boxed{...}, else the text after the last 'Answer:', else the last number."""
    boxed = _BOXED.findall(text)
    if boxed:
        return boxed[-1].strip()
    if "Answer:" in text:
        tail = text.rsplit("Answer:", 1)[1]
        numbers = _NUMBER.findall(tail)
        return numbers[0] if numbers else tail.strip() or None
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def _same_answer(answer: str, label: Any) -> bool:
    try:
        return abs(float(answer) - float(label)) < 1e-6
    except (TypeError, ValueError):
        return answer.strip() == str(label).strip()


def math_reward(sample: Sample) -> float:
    """1.0 when the extracted final answer equals the label (numerically when both are numbers)."""
    answer = extract_answer(sample.response)
    return 1.0 if answer is not None and _same_answer(answer, sample.label) else 0.0


def exact_match_reward(sample: Sample) -> float:
    """1.0 when the stripped response equals the stripped label."""
    return 1.0 if sample.response.strip() == str(sample.label).strip() else 0.0


REWARD_FUNCTIONS: dict[str, Callable[[Sample], float]] = {"math": math_reward, "exact": exact_match_reward}


def get_reward_function(rm_type: str | None, custom_rm_path: str | None) -> Callable[..., Any]:
    """The reward function a run uses: a plugin `(args, sample) -> reward` by path, else a built-in by name."""
    if custom_rm_path:
        from slime_like.plugin_loader import load_plugin

        fn = load_plugin(custom_rm_path, "--custom-rm-path", params=2)
        return fn
    if rm_type not in REWARD_FUNCTIONS:
        raise ValueError(
            f"--rm-type {rm_type!r} is not known; choose one of {sorted(REWARD_FUNCTIONS)} or set --custom-rm-path"
        )
    builtin = REWARD_FUNCTIONS[rm_type]
    return lambda args, sample: builtin(sample)


async def score_sample(reward_fn: Callable[..., Any], args: Any, sample: Sample) -> bool:
    """Set `sample.reward`; a reward function that raises marks the sample failed with reward 0. True if it succeeded."""
    try:
        reward = reward_fn(args, sample)
        if inspect.isawaitable(reward):
            reward = await reward
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the user's reward code may raise anything; the run must go on
        logger.warning("reward function failed on sample %s: %r", sample.index, exc)
        sample.reward = 0.0
        sample.status = Status.FAILED
        sample.metadata["reward_error"] = repr(exc)
        return False
    sample.reward = reward
    return True
