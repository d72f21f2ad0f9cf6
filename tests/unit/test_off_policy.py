"""Off-policy weights (TIS, MIS, decoupled PPO), mismatch metrics and loss aggregation, hand-computed."""

from __future__ import annotations

import math

import pytest
import torch

from slime_like.trainer.algorithms.aggregation import token_weights
from slime_like.trainer.algorithms.off_policy import decoupled_weights, mis_weights, mismatch_sums, tis_weights


def _log(*ratios: float) -> torch.Tensor:
    return torch.log(torch.tensor(ratios))


def test_tis_truncates_both_sides() -> None:
    # clip(rho, 0.1, 2): 3 -> 2, 0.5 -> 0.5, 1 -> 1, 0.05 -> 0.1.
    assert tis_weights(_log(3.0, 0.5, 1.0, 0.05), 0.1, 2.0).tolist() == pytest.approx([2.0, 0.5, 1.0, 0.1])


def test_mis_token_sequence_and_geometric() -> None:
    mask = torch.ones(4)
    # token level, band [0.5, 2]: rho inside keeps its value, outside becomes 0 (bounds inclusive).
    got = mis_weights(_log(3.0, 0.5, 1.0, 0.4), mask, "token", 0.5, 2.0)
    assert got.tolist() == pytest.approx([0.0, 0.5, 1.0, 0.0])
    # sequence level over masked tokens only: rho = 2 * 2 = 4 (the padding's ratio 8 is ignored) ->
    # outside the band: every token 0. Geometric mean sqrt(2 * 2) = 2 -> inside: every token 2.
    log_ratio, mask = _log(2.0, 2.0, 8.0), torch.tensor([1.0, 1.0, 0.0])
    assert mis_weights(log_ratio, mask, "sequence", 0.5, 2.0).tolist() == [0.0, 0.0, 0.0]
    assert mis_weights(log_ratio, mask, "geometric", 0.5, 2.0).tolist() == pytest.approx([2.0, 2.0, 2.0])


def test_decoupled_weights_drop_above_cap() -> None:
    # AReaL: weight pi_prox / pi_behav, zero where it exceeds the cap.
    assert decoupled_weights(_log(1.5, 3.0), 2.0).tolist() == pytest.approx([1.5, 0.0])
    assert decoupled_weights(_log(1.5, 3.0), None).tolist() == pytest.approx([1.5, 3.0])


def test_weights_are_detached() -> None:
    log_ratio = torch.zeros(2, requires_grad=True)
    assert not tis_weights(log_ratio, 0.0, 2.0).requires_grad
    assert not mis_weights(log_ratio, torch.ones(2), "token", 0.5, 2.0).requires_grad
    assert not decoupled_weights(log_ratio, 2.0).requires_grad


def test_mismatch_sums() -> None:
    # d = log pi - log mu = [ln 2, -ln 2, ln 3]; the third token is padding.
    # |d| sum: 2 ln 2. k3 KL(mu||pi) = rho - 1 - d: (2 - 1 - ln 2) + (0.5 - 1 + ln 2) = 0.5.
    # Band [0.5, 2] (inclusive): both real tokens inside, the padding's 3 does not count.
    d = _log(2.0, 0.5, 3.0)
    sums = mismatch_sums(d, torch.zeros(3), torch.tensor([1.0, 1.0, 0.0]), 0.5, 2.0)
    assert sums["abs_diff"] == pytest.approx(2 * math.log(2))
    assert sums["kl"] == pytest.approx(0.5)
    assert sums["out_of_band"] == 0.0
    assert mismatch_sums(d, torch.zeros(3), torch.ones(3), 0.5, 2.0)["out_of_band"] == 1.0


def test_aggregation_modes_hand_computed() -> None:
    # Three sequences: losses [1, 2, 3, (99 padding)], [4, (99)], and one with no loss token at all.
    # N = 4 loss tokens, B = 2 sequences with loss tokens (the empty one does not count).
    losses = [torch.tensor([1.0, 2.0, 3.0, 99.0]), torch.tensor([4.0, 99.0]), torch.tensor([7.0, 7.0])]
    masks = [torch.tensor([1.0, 1.0, 1.0, 0.0]), torch.tensor([1.0, 0.0]), torch.zeros(2)]

    def agg(mode: str, max_len: int | None = None) -> float:
        weights = token_weights(masks, mode, max_len)
        return sum(float((w * x).sum()) for w, x in zip(weights, losses, strict=True))

    assert agg("token-mean") == pytest.approx((1 + 2 + 3 + 4) / 4)  # 2.5
    assert agg("seq-mean-token-sum") == pytest.approx((6 + 4) / 2)  # 5
    assert agg("seq-mean-token-mean") == pytest.approx((6 / 3 + 4 / 1) / 2)  # 3
    assert agg("seq-mean-token-sum-norm", 8) == pytest.approx((6 + 4) / (2 * 8))  # 0.625
    with pytest.raises(ValueError, match="--loss-agg-mode"):
        token_weights(masks, "sum")
