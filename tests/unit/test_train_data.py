"""Conversion of finished groups into training columns."""

from __future__ import annotations

import pytest

from buffer.train_data import build_train_data
from slime_like.core.sample import Sample, Status


def _sample(index: int, reward: float, n_resp: int, status: Status = Status.COMPLETED) -> Sample:
    return Sample(
        tokens=[7] * (3 + n_resp),
        response_length=n_resp,
        reward=reward,
        status=status,
        index=index,
        rollout_log_probs=[-0.5] * n_resp,
    )


def test_build_train_data_leaves_failed_samples_out() -> None:
    group = [_sample(0, 1.0, 2), _sample(1, 0.0, 3, Status.FAILED), _sample(2, 0.0, 4), _sample(3, 0.0, 1)]
    other = [_sample(4, 0.5, 2), _sample(5, 0.0, 1, Status.ABORTED)]
    data = build_train_data([group, other])
    # The failed and aborted samples' rewards are unknown: they are neither trained on nor in group stats.
    assert data.sample_indices == [0, 2, 3, 4]
    assert data.group_ids == [0, 0, 0, 1]
    assert data.raw_rewards == [1.0, 0.0, 0.0, 0.5]
    assert data.loss_masks == [[1, 1], [1, 1, 1, 1], [1], [1, 1]]
    assert data.rollout_log_probs[0] == [-0.5, -0.5]
    # A group with nothing usable contributes nothing.
    assert len(build_train_data([[_sample(6, 0.0, 2, Status.FAILED)]])) == 0


def test_missing_rollout_log_probs_stay_missing() -> None:
    s = _sample(0, 1.0, 2)
    s.rollout_log_probs = None
    assert build_train_data([[s]]).rollout_log_probs == [None]
    s.rollout_log_probs = [-1.0]
    with pytest.raises(ValueError, match="1 rollout log-probs for 2 response tokens"):
        build_train_data([[s]])


def test_loss_mask_length_is_checked() -> None:
    s = _sample(0, 1.0, 2)
    s.loss_mask = [1, 0, 1]
    with pytest.raises(ValueError, match="loss_mask has 3 entries"):
        build_train_data([[s]])


def test_dict_reward_needs_key() -> None:
    s = _sample(0, 0.0, 1)
    s.reward = {"acc": 1.0}
    with pytest.raises(ValueError, match="--reward-key"):
        build_train_data([[s]])
    assert build_train_data([[s]], reward_key="acc").raw_rewards == [1.0]
