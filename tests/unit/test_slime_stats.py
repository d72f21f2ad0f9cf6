"""slime's --log-multi-turn and --log-correct-samples: the statistics, hand-computed, and their flags."""

from __future__ import annotations

import pytest

from rollout.metrics import rollout_metrics
from rollout.slime_stats import correct_sample_metrics, length_quartiles, multi_turn_metrics
from slime_like.arguments import parse_args
from slime_like.core.sample import Sample


def _sample(n: int, mask: list[int] | None = None, reward: float = 0.0, **meta: object) -> Sample:
    return Sample(tokens=[0] * (n + 1), response_length=n, loss_mask=mask, reward=reward, metadata=dict(meta))


def test_multi_turn_lengths_and_rounds() -> None:
    samples = [_sample(4, [1, 0, 0, 1], round_number=2), _sample(8, None, round_number=1)]
    m = multi_turn_metrics(samples, max_response_len=8)
    assert m["multi_turn/raw_response_length/response_length_mean"] == 6.0
    assert m["multi_turn/raw_response_length/response_length_max"] == 8.0
    assert m["multi_turn/raw_response_length/response_length_min"] == 4.0
    assert m["multi_turn/raw_response_length/response_length_clip_ratio"] == 0.5  # 8 >= 8
    assert m["multi_turn/wo_obs_response_length/response_length_mean"] == 5.0  # (2 + 8) / 2
    assert m["multi_turn/wo_obs_response_length/response_length_min"] == 2.0
    assert m["multi_turn/multi_turn_metric/round_number_mean"] == 1.5
    assert m["multi_turn/multi_turn_metric/round_number_max"] == 2.0
    assert "multi_turn/multi_turn_metric/round_number_mean" not in multi_turn_metrics([_sample(3)], 8)
    assert multi_turn_metrics([], 8) == {}


def test_length_quartiles_as_slime() -> None:
    # max 100: cuts 25, 50, 75, 100; 25 -> p25, 26 -> p50, 100 -> p100, 101 -> none
    q = length_quartiles(100, [25, 26, 100, 101])
    assert q["p25"] == pytest.approx(1 / 3) and q["p50"] == pytest.approx(1 / 3)
    assert q["p75"] == 0.0 and q["p100"] == pytest.approx(1 / 3)
    assert length_quartiles(100, []) == {"p25": 0.0, "p50": 0.0, "p75": 0.0, "p100": 0.0}


def test_correct_samples() -> None:
    right = _sample(2, [1, 1], reward=1.0)
    right.rollout_log_probs = [-1.0, -3.0]  # mean -log p: 2.0
    masked = _sample(6, [1, 0, 0, 0, 0, 0], reward=1.0)
    masked.rollout_log_probs = [-0.5, -9.0, -9.0, -9.0, -9.0, -9.0]  # only the first token: 0.5
    wrong = _sample(4, reward=0.0)
    wrong.rollout_log_probs = [-7.0] * 4
    samples = [right, masked, wrong]
    m = correct_sample_metrics(samples, [1.0, 1.0, 0.0], max_response_len=8)
    assert m["rollout/correct_response_lengths"] == 4.0
    assert m["rollout/correct_length/p25"] == pytest.approx(0.5)  # 2 <= 2
    assert m["rollout/correct_length/p75"] == pytest.approx(0.5)  # 4 < 6 <= 6
    assert m["rollout/correct_length/p50"] == 0.0 and m["rollout/correct_length/p100"] == 0.0
    assert m["rollout/correct_entropy"] == pytest.approx(1.25)
    none = correct_sample_metrics([wrong], [0.0], 8)
    assert none["rollout/correct_entropy"] == 0.0 and none["rollout/correct_response_lengths"] == 0.0


def test_flags_turn_them_on(base: list[str]) -> None:
    groups = [[_sample(4, [1, 1, 0, 0], reward=1.0, round_number=3), _sample(8, reward=0.0, round_number=1)]]
    plain = rollout_metrics(groups, None, args=parse_args(base))
    assert not any(k.startswith("multi_turn/") or "correct_" in k for k in plain)
    args = parse_args(base + ["--log-multi-turn", "--log-correct-samples", "--rollout-max-response-len", "8"])
    m = rollout_metrics(groups, None, args=args)
    assert m["multi_turn/multi_turn_metric/round_number_mean"] == 2.0
    assert m["multi_turn/wo_obs_response_length/response_length_mean"] == 5.0
    assert m["rollout/correct_response_lengths"] == 4.0 and m["rollout/correct_length/p50"] == pytest.approx(1.0)
