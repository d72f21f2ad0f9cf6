"""PPO clip loss and KL estimators against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from slime_like.algorithms.kl import kl_estimate
from slime_like.algorithms.policy_loss import ppo_clip_loss


def test_ppo_clip_both_sides_hand_computed() -> None:
    # ratios 1.5, 0.5, 1.1, 0.7 via log-prob differences; eps_low 0.2, eps_high 0.28 (clip-higher).
    old = torch.zeros(4)
    new = torch.log(torch.tensor([1.5, 0.5, 1.1, 0.7]))
    adv = torch.tensor([1.0, -1.0, 2.0, 1.0])
    loss, ratio, clipped = ppo_clip_loss(new, old, adv, 0.2, 0.28)
    # token 0: A>0, r=1.5 > 1.28 -> max(-1.5, -1.28) = -1.28 (clipped)
    # token 1: A<0, r=0.5 < 0.8 -> max(0.5, 0.8) = 0.8 (clipped)
    # token 2: A=2, r=1.1 inside -> -2.2 (not clipped)
    # token 3: A>0, r=0.7 < 0.8 -> max(-0.7, -0.8) = -0.7 (unclipped term is larger; not clipped)
    assert loss.tolist() == pytest.approx([-1.28, 0.8, -2.2, -0.7])
    assert clipped.tolist() == [1.0, 1.0, 0.0, 0.0]
    assert ratio.tolist() == pytest.approx([1.5, 0.5, 1.1, 0.7])


def test_ratio_one_gradient_is_minus_advantage() -> None:
    # At r = 1 the gradient of -A*r w.r.t. log pi is -A (d r / d logp = r = 1).
    logp = torch.zeros(3, requires_grad=True)
    adv = torch.tensor([0.5, -2.0, 1.0])
    loss, ratio, _ = ppo_clip_loss(logp, torch.zeros(3), adv, 0.2, 0.2)
    loss.sum().backward()
    assert ratio.tolist() == [1.0, 1.0, 1.0]
    assert logp.grad.tolist() == pytest.approx([-0.5, 2.0, -1.0])


@pytest.mark.parametrize(
    ("kl_type", "expected"),
    [
        # d = log(2) - log(1) = ln 2
        ("k1", math.log(2)),
        ("k2", 0.5 * math.log(2) ** 2),
        # k3 = exp(-d) - 1 + d = 0.5 - 1 + ln 2
        ("k3", 0.5 - 1 + math.log(2)),
        ("low_var_kl", 0.5 - 1 + math.log(2)),
    ],
)
def test_kl_estimators_hand_computed(kl_type: str, expected: float) -> None:
    got = kl_estimate(torch.tensor([math.log(2.0)]), torch.tensor([0.0]), kl_type)
    assert got.item() == pytest.approx(expected)


def test_kl_gradients() -> None:
    # d/d(logp) of k2 = d; of k3 = 1 - exp(-d). At d = ln 2: ln 2 and 0.5.
    for kl_type, grad in [("k2", math.log(2)), ("k3", 0.5), ("k1", 1.0)]:
        logp = torch.tensor([math.log(2.0)], requires_grad=True)
        kl_estimate(logp, torch.tensor([0.0]), kl_type).sum().backward()
        assert logp.grad.item() == pytest.approx(grad)


def test_low_var_kl_clamps_extreme_ratios() -> None:
    # d = -50 would give exp(50); clamped to -10: exp(10) - 1 - 10.
    got = kl_estimate(torch.tensor([-50.0]), torch.tensor([0.0]), "low_var_kl")
    assert got.item() == pytest.approx(math.exp(10) - 11)
    assert kl_estimate(torch.tensor([0.3]), torch.tensor([0.3]), "k3").item() == 0.0
