"""Group reward normalisation and the DP split, against hand-computed numbers."""

from __future__ import annotations

import math

import pytest

from buffer.train_data import build_train_data, normalize_group_rewards
from slime_like.sample import Sample, Status


def test_grpo_normalisation_hand_computed() -> None:
    # rewards [1, 0, 0, 1]: mean 0.5, population std sqrt(((.5)^2*4)/4) = 0.5 -> +-1.
    assert normalize_group_rewards([1, 0, 0, 1], eps=0) == [1.0, -1.0, -1.0, 1.0]
    # rewards [3, 0, 0]: mean 1, deviations [2, -1, -1], std sqrt(6/3) = sqrt(2).
    got = normalize_group_rewards([3, 0, 0], eps=0)
    assert got == pytest.approx([2 / math.sqrt(2), -1 / math.sqrt(2), -1 / math.sqrt(2)])
    # Dr.GRPO: no std division.
    assert normalize_group_rewards([3, 0, 0], use_std=False) == [2.0, -1.0, -1.0]
    # Zero variance: all zero, no division by zero.
    assert normalize_group_rewards([1, 1, 1]) == [0.0, 0.0, 0.0]


def _sample(index: int, reward: float, n_resp: int, status: Status = Status.COMPLETED) -> Sample:
    return Sample(
        tokens=[7] * (3 + n_resp),
        response_length=n_resp,
        reward=reward,
        status=status,
        index=index,
        rollout_log_probs=[-0.5] * n_resp,
    )


def test_build_train_data_leaves_failed_samples_out_of_stats_and_training() -> None:
    group = [_sample(0, 1.0, 2), _sample(1, 0.0, 3, Status.FAILED), _sample(2, 0.0, 4), _sample(3, 0.0, 1)]
    data = build_train_data([group])
    # The failed sample's reward is unknown: group stats over rewards [1, 0, 0] only.
    assert data.sample_indices == [0, 2, 3]
    # mean 1/3, deviations [2/3, -1/3, -1/3], population std sqrt((4/9 + 1/9 + 1/9) / 3) = sqrt(2)/3.
    std = 2**0.5 / 3
    assert data.rewards == pytest.approx([(2 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6)])
    assert data.loss_masks == [[1, 1], [1, 1, 1, 1], [1]]
    assert data.raw_rewards == [1.0, 0.0, 0.0]
    # A group with nothing usable contributes nothing.
    assert len(build_train_data([[_sample(4, 0.0, 2, Status.FAILED)]])) == 0


def test_dict_reward_needs_key() -> None:
    s = _sample(0, 0.0, 1)
    s.reward = {"acc": 1.0}
    with pytest.raises(ValueError, match="--reward-key"):
        build_train_data([[s]])
    assert build_train_data([[s]], normalize=False, reward_key="acc").rewards == [1.0]
