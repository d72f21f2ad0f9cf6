"""What the rollout side hands the driver for training: metrics, a failure summary and one object ref per
data-parallel rank. The samples stay with the rollout manager; each trainer rank fetches only its own share.

Before the split the rewards are shaped where every sample of a group is (buffer.group_rewards.shape_rewards: the
overlong penalty and the estimator's group baseline, read from the run's arguments), so each rank receives only
its own rows' rewards. The split (buffer.train_data.split_by_dp) is the trainer's: every optimizer step
token-balanced over the DP ranks, lengths rounded up to the padding of the trainer's micro-batch layout, which the
trainer reports once at start (TrainLayout).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray

from buffer.accounting import all_failed
from buffer.group_rewards import RewardShaping, shape_rewards
from buffer.train_data import TrainData, build_train_data, split_by_dp
from rollout.debug_data import save_train_data
from slime_like.core.sample import Sample


@dataclass(frozen=True)
class TrainLayout:
    """How the trainer takes a rollout: its DP size, the length multiple its packing pads to, the step size."""

    dp_size: int
    multiple: int
    global_batch_size: int


@dataclass
class RolloutResult:
    """One rollout as the driver sees it: no samples, only what it logs, checks and passes on."""

    metrics: dict[str, Any]
    failure: str | None = None  # why no sample can train (every one failed), else None
    shares: list[ray.ObjectRef] = field(default_factory=list)  # one per DP rank; empty without a trainer
    samples: int = 0  # samples in the shares together


def hand_off(
    rollout_id: int,
    groups: list[list[Sample]],
    metrics: dict[str, Any],
    layout: TrainLayout | None,
    reward_key: str | None,
    save_train_data_path: str | None = None,
    convert: Callable[[list[list[Sample]]], TrainData] | None = None,
    shaping: RewardShaping | None = None,
) -> RolloutResult:
    """The driver's view of a finished rollout; with a trainer (`layout`), its training data (built, or made by
    `convert`: slime's --custom-convert-samples-to-train-data-path), its rewards shaped (`shaping`: the run's
    estimator; None leaves them unshaped, which only a trainer that shapes a whole rollout itself can take), split
    and put into the object store, one object per DP rank (--save-debug-train-data saves the whole, unsplit, first)."""
    failure = all_failed(groups)
    if failure or layout is None:  # nothing to train on, or nobody to train (--debug-rollout-only)
        return RolloutResult(metrics, failure)
    data = convert(groups) if convert is not None else build_train_data(groups, reward_key=reward_key)
    if shaping is not None:
        data = shape_rewards(data, shaping)
    if save_train_data_path:
        save_train_data(save_train_data_path, rollout_id, data)
    shares = split_by_dp(data, layout.dp_size, layout.global_batch_size, layout.multiple)
    return RolloutResult(metrics, None, [ray.put(share) for share in shares], len(data))
