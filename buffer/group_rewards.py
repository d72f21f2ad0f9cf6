"""Each sample's training reward, shaped on the rollout side, where every sample of a group is (before the DP split).

Two numbers per sample, computed once per rollout (shape_rewards); each trainer rank receives those of its own rows:
- `rewards`: the task reward plus DAPO's soft overlong penalty (--overlong-buffer-len; see
  slime_like/trainer/algorithms/dapo.py). Every estimator, and a custom advantage function, takes it as the reward.
- `baselined_rewards`: those rewards after the estimator's group baseline, which needs the whole group:
  grpo/gspo/cispo (r - mean) / (std + eps), or r - mean with --disable-grpo-std-normalization (Dr.GRPO, grpo.py);
  rloo r minus the leave-one-out mean (rloo.py); reinforce_plus_plus_baseline r - mean (reinforce_pp.py).
  reinforce_plus_plus and ppo have no group baseline: the rewards. --disable-rewards-normalization, or rewards a
  slime reward post-process already normalised (reward_normalized on every sample), leave grpo's and
  reinforce_plus_plus_baseline's as they are; rloo's baseline is its estimator and always applies.
This is slime's _post_process_rewards, which also runs before its _split_train_data_by_dp. The estimator is read
from the run's arguments (RewardShaping.from_args): the rollout manager holds the same namespace as the trainer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from buffer.train_data import TrainData, rewards_normalized

NORMALISED = ("grpo", "gspo", "cispo")  # the group-normalised reward is the advantage


def normalize_group_rewards(rewards: list[float], use_std: bool = True, eps: float = 1e-6) -> list[float]:
    """(r - mean(group)) / (unbiased std(group) + eps); without std it is Dr.GRPO's r - mean."""
    mean = sum(rewards) / len(rewards)
    centred = [r - mean for r in rewards]
    if not use_std or len(rewards) < 2:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / (len(rewards) - 1))
    return [c / (std + eps) for c in centred]


def by_group(group_ids: list[int]) -> dict[int, list[int]]:
    """Row indices of each group, in row order."""
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(g, []).append(i)
    return groups


def grpo_advantages(rewards: list[float], group_ids: list[int], use_std: bool = True) -> list[float]:
    """One scalar advantage per sample: its reward normalised within its group."""
    out = [0.0] * len(rewards)
    for rows in by_group(group_ids).values():
        for i, a in zip(rows, normalize_group_rewards([rewards[i] for i in rows], use_std), strict=True):
            out[i] = a
    return out


def rloo_advantages(rewards: list[float], group_ids: list[int]) -> list[float]:
    """One scalar advantage per sample: reward minus the leave-one-out mean of its group (0 in a group of one)."""
    out = [0.0] * len(rewards)
    for rows in by_group(group_ids).values():
        k = len(rows)
        if k < 2:
            continue
        total = sum(rewards[i] for i in rows)
        for i in rows:
            out[i] = rewards[i] - (total - rewards[i]) / (k - 1)
    return out


def group_centred(rewards: list[float], group_ids: list[int]) -> list[float]:
    """Each reward minus its group's mean (the REINFORCE++-baseline)."""
    out = list(rewards)
    for rows in by_group(group_ids).values():
        for i, c in zip(rows, normalize_group_rewards([rewards[i] for i in rows], use_std=False), strict=True):
            out[i] = c
    return out


def overlong_penalty(response_length: int, max_len: int, buffer_len: int, factor: float = 1.0) -> float:
    """DAPO's (non-positive) soft overlong penalty of one response: 0 up to max_len - buffer_len, then falling
    linearly to -factor at max_len, -factor beyond."""
    expected = max_len - buffer_len
    if response_length <= expected:
        return 0.0
    if response_length <= max_len:
        return factor * (expected - response_length) / buffer_len
    return -factor


@dataclass(frozen=True)
class RewardShaping:
    """The arguments that shape the rewards: the estimator, its normalisation, DAPO's overlong penalty."""

    estimator: str
    use_std: bool = True  # --disable-grpo-std-normalization: False
    normalization: bool = True  # --disable-rewards-normalization: False
    max_response_len: int | None = None  # --rollout-max-response-len
    overlong_buffer_len: int = 0  # 0: no overlong penalty
    overlong_penalty_factor: float = 1.0

    @classmethod
    def from_args(cls, args: Any) -> RewardShaping:
        """The run's shaping, from the parsed arguments the rollout manager and the trainer share."""
        return cls(
            args.advantage_estimator,
            not getattr(args, "disable_grpo_std_normalization", False),
            getattr(args, "rewards_normalization", True),
            getattr(args, "rollout_max_response_len", None),
            getattr(args, "overlong_buffer_len", 0) or 0,
            getattr(args, "overlong_penalty_factor", 1.0),
        )

    def penalty(self, response_length: int) -> float:
        """The overlong penalty of a response of `response_length` tokens (0.0 without --overlong-buffer-len)."""
        if not self.overlong_buffer_len:
            return 0.0
        if self.max_response_len is None:
            raise ValueError("--overlong-buffer-len needs --rollout-max-response-len")
        return overlong_penalty(
            response_length, self.max_response_len, self.overlong_buffer_len, self.overlong_penalty_factor
        )

    def baselined(self, rewards: list[float], group_ids: list[int], normalized: bool = False) -> list[float]:
        """`rewards` after the estimator's group baseline (`normalized`: a slime post-process already normalised
        them). `rewards` and `group_ids` must cover whole groups."""
        if self.estimator == "rloo":
            return rloo_advantages(rewards, group_ids)
        if normalized or not self.normalization:
            return list(rewards)
        if self.estimator in NORMALISED:
            return grpo_advantages(rewards, group_ids, self.use_std)
        if self.estimator == "reinforce_plus_plus_baseline":
            return group_centred(rewards, group_ids)
        return list(rewards)


def shape_rewards(data: TrainData, shaping: RewardShaping) -> TrainData:
    """`data` (a whole rollout) with its `rewards` and `baselined_rewards` columns filled (a shallow copy; as it is
    when it has no rewards, as an SFT rollout built by hand)."""
    if not data.raw_rewards:
        return data
    if shaping.overlong_buffer_len:
        rewards = [r + shaping.penalty(n) for r, n in zip(data.raw_rewards, data.response_lengths, strict=True)]
    else:
        rewards = list(data.raw_rewards)
    baselined = shaping.baselined(rewards, data.group_ids, rewards_normalized(data))
    return replace(data, rewards=rewards, baselined_rewards=baselined)
