"""slime.rollout.base_types: what a rollout function returns, and how slime calls one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slime.utils.types import Sample


@dataclass
class RolloutFnTrainOutput:
    """A training rollout's groups (a group may hold nested lists: samples a generate function fanned out)."""

    samples: list[list[Sample]]
    metrics: dict[str, Any] | None = None


@dataclass
class RolloutFnEvalOutput:
    """An eval's results: {dataset: {"rewards": [...], "truncated": [...], "samples": [...]}}."""

    data: dict[str, dict[str, Any]]
    metrics: dict[str, Any] | None = None


def call_rollout_fn(
    fn: Callable[..., Any], *args: Any, evaluation: bool, **kwargs: Any
) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    """Call a rollout function; a plain (legacy) return value is wrapped in the output type."""
    out = fn(*args, **kwargs, evaluation=evaluation)
    if isinstance(out, RolloutFnTrainOutput | RolloutFnEvalOutput):
        return out
    return RolloutFnEvalOutput(data=out) if evaluation else RolloutFnTrainOutput(samples=out)
