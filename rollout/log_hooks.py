"""slime's custom log functions: --custom-rollout-log-function-path and --custom-eval-rollout-log-function-path.

slime's contracts: `log_rollout_data(rollout_id, args, samples, rollout_extra_metrics, rollout_time) -> bool` with the
rollout's samples (flat), and `log_eval_rollout_data(rollout_id, args, data, extra_metrics) -> bool` with `data`
per eval dataset: `{"rewards", "truncated", "samples"}`. Each runs on the rollout side, where the samples are, after
the metrics are computed; True means "skip the default logging": the metrics computed from the samples (rewards,
lengths, pass@k, rates) are then left out of the step's record, and the counters and timings stay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rollout.slime_arguments import eval_reward_key
from rollout.slime_contract import slime_args
from slime_like.core.sample import Sample, Status, scalar_reward

ROLLOUT_LOG_FLAG = "--custom-rollout-log-function-path"
EVAL_LOG_FLAG = "--custom-eval-rollout-log-function-path"


def log_rollout(
    fn: Callable[..., Any] | None,
    args: Any,
    rollout_id: int,
    groups: list[list[Sample]],
    metrics: dict[str, Any],
    default_keys: set[str],
    elapsed: float,
) -> dict[str, Any]:
    """The step's rollout metrics after the custom rollout log function (those in `default_keys` dropped if it
    returned True)."""
    if fn is None:
        return metrics
    samples = [s for g in groups for s in g]
    if fn(rollout_id, slime_args(args), samples, dict(metrics), elapsed):
        return {k: v for k, v in metrics.items() if k not in default_keys}
    return metrics


def log_eval(
    fn: Callable[..., Any] | None, args: Any, rollout_id: int, groups: list[list[Sample]], metrics: dict[str, Any]
) -> dict[str, Any]:
    """The eval metrics after the custom eval log function (per-dataset metrics dropped if it returned True)."""
    if fn is None:
        return metrics
    data: dict[str, dict[str, list[Any]]] = {}
    for sample in (s for g in groups for s in g):
        entry = data.setdefault(sample.metadata.get("eval_dataset", "eval"), {"rewards": [], "truncated": [], "samples": []})  # fmt: skip
        entry["rewards"].append(scalar_reward(sample, eval_reward_key(args)))
        entry["truncated"].append(sample.status == Status.TRUNCATED)
        entry["samples"].append(sample)
    if fn(rollout_id, slime_args(args), data, dict(metrics)):
        per_dataset = tuple(f"eval/{name}" for name in data) + ("eval/reward_mean",)
        return {k: v for k, v in metrics.items() if not k.startswith(per_dataset)}
    return metrics
