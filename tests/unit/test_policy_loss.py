"""Policy objectives (PPO clip, dual-clip, GSPO, CISPO) and KL estimators against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from slime_like.trainer.algorithms.cispo import cispo_loss
from slime_like.trainer.algorithms.gspo import gspo_loss
from slime_like.trainer.algorithms.kl import kl_estimate
from slime_like.trainer.algorithms.policy_loss import ppo_clip_loss


def test_ppo_clip_both_sides_hand_computed() -> None:
    # ratios 1.5, 0.5, 1.1, 0.7 via log-prob differences; eps_low 0.2, eps_high 0.28 (clip-higher).
    old = torch.zeros(4)
    new = torch.log(torch.tensor([1.5, 0.5, 1.1, 0.7]))
    adv = torch.tensor([1.0, -1.0, 2.0, 1.0])
    out = ppo_clip_loss(new, old, adv, 0.2, 0.28)
    # token 0: A>0, r=1.5 > 1.28 -> max(-1.5, -1.28) = -1.28 (clipped)
    # token 1: A<0, r=0.5 < 0.8 -> max(0.5, 0.8) = 0.8 (clipped)
    # token 2: A=2, r=1.1 inside -> -2.2 (not clipped)
    # token 3: A>0, r=0.7 < 0.8 -> max(-0.7, -0.8) = -0.7 (unclipped term is larger; not clipped)
    assert out.loss.tolist() == pytest.approx([-1.28, 0.8, -2.2, -0.7])
    assert out.clipped.tolist() == [1.0, 1.0, 0.0, 0.0]
    assert out.ratio.tolist() == pytest.approx([1.5, 0.5, 1.1, 0.7])
    assert out.dual_clipped.tolist() == [0.0] * 4


def test_ratio_one_gradient_is_minus_advantage() -> None:
    # At r = 1 the gradient of -A*r w.r.t. log pi is -A (d r / d logp = r = 1).
    logp = torch.zeros(3, requires_grad=True)
    adv = torch.tensor([0.5, -2.0, 1.0])
    out = ppo_clip_loss(logp, torch.zeros(3), adv, 0.2, 0.2)
    out.loss.sum().backward()
    assert out.ratio.tolist() == [1.0, 1.0, 1.0]
    assert logp.grad.tolist() == pytest.approx([-0.5, 2.0, -1.0])


def test_dual_clip_caps_negative_advantages_only() -> None:
    # eps 0.2, c = 3. Ratios r and advantages A per token:
    # t0: A=-1, r=5 -> PPO max(5, 1.2) = 5 > cap -c*A = 3 -> 3 (dual-clipped, no gradient)
    # t1: A=-1, r=2 -> PPO max(2, 1.2) = 2 < 3 -> 2 (unclipped, d/dlogp of -A*r = r = 2)
    # t2: A=+1, r=5 -> PPO max(-5, -1.2) = -1.2 (clipped; dual-clip never applies to A > 0)
    # t3: A=-2, r=0.5 -> PPO max(1.0, 1.6) = 1.6 < cap 6 -> 1.6 (clipped on the low side)
    logp = torch.log(torch.tensor([5.0, 2.0, 5.0, 0.5])).requires_grad_()
    adv = torch.tensor([-1.0, -1.0, 1.0, -2.0])
    out = ppo_clip_loss(logp, torch.zeros(4), adv, 0.2, 0.2, eps_clip_c=3.0)
    assert out.loss.tolist() == pytest.approx([3.0, 2.0, -1.2, 1.6])
    assert out.dual_clipped.tolist() == [1.0, 0.0, 0.0, 0.0]
    # PPO's clipped term was taken on t2 and t3 only (on t0 the unclipped 5 was larger).
    assert out.clipped.tolist() == [0.0, 0.0, 1.0, 1.0]
    out.loss.sum().backward()
    assert logp.grad.tolist() == pytest.approx([0.0, 2.0, 0.0, 0.0])


def test_gspo_sequence_ratio_value_and_gradient() -> None:
    # Token log-ratios [0.2, 0.0, 0.4] with the last token padding (mask 0):
    # s = exp((0.2 + 0.0) / 2) = exp(0.1) on every token. A = 1, eps 0.2: inside the band.
    # Averaged over the 2 real tokens (seq-mean-token-mean), the loss is -A*s, and GSPO's gradient
    # d(-A*s)/d logp_t = -A * s / |y| = -exp(0.1)/2 for real tokens, 0 for the padding token.
    old = torch.zeros(3)
    logp = torch.tensor([0.2, 0.0, 0.4], requires_grad=True)
    mask = torch.tensor([1.0, 1.0, 0.0])
    out = gspo_loss(logp, old, torch.ones(3), mask, 0.2, 0.2)
    s = math.exp(0.1)
    assert out.ratio.tolist() == pytest.approx([s, s, s])
    ((out.loss * mask) / 2).sum().backward()
    assert logp.grad.tolist() == pytest.approx([-s / 2, -s / 2, 0.0])
    assert out.clipped.tolist() == [0.0, 0.0, 0.0]


def test_gspo_clips_the_sequence_ratio() -> None:
    # log-ratios [0.5, 0.3]: s = exp(0.4) = 1.4918 > 1.2. A = +1 -> -1.2 on both tokens, no gradient;
    # A = -1 -> max(1.4918, 1.2) = 1.4918, unclipped.
    logp = torch.tensor([0.5, 0.3], requires_grad=True)
    mask = torch.ones(2)
    pos = gspo_loss(logp, torch.zeros(2), torch.ones(2), mask, 0.2, 0.2)
    assert pos.loss.tolist() == pytest.approx([-1.2, -1.2])
    assert pos.clipped.tolist() == [1.0, 1.0]
    pos.loss.sum().backward()
    assert logp.grad.tolist() == [0.0, 0.0]
    neg = gspo_loss(logp, torch.zeros(2), -torch.ones(2), mask, 0.2, 0.2)
    assert neg.loss.tolist() == pytest.approx([math.exp(0.4)] * 2)


def test_gspo_concatenated_sequences_keep_their_own_ratio() -> None:
    # Two sequences concatenated (lengths 2 and 3): log-ratios [0.2, 0.0 | 0.3, 0.3, 9.0] with the last token
    # padding. Sequence 1: s = exp(0.1); sequence 2: s = exp((0.3 + 0.3) / 2) = exp(0.3) = 1.35 > 1.2 -> clipped
    # for A = +1 (loss -1.2, no gradient); sequence 1 stays inside the band (loss -exp(0.1)).
    logp = torch.tensor([0.2, 0.0, 0.3, 0.3, 9.0], requires_grad=True)
    mask = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0])
    out = gspo_loss(logp, torch.zeros(5), torch.ones(5), mask, 0.2, 0.2, lengths=[2, 3])
    s1, s2 = math.exp(0.1), math.exp(0.3)
    assert out.ratio.tolist() == pytest.approx([s1, s1, s2, s2, s2])
    assert out.loss.tolist() == pytest.approx([-s1, -s1, -1.2, -1.2, -1.2])
    assert out.clipped.tolist() == [0.0, 0.0, 1.0, 1.0, 1.0]
    (out.loss * mask).sum().backward()  # summed, not averaged: d(-s1 * 2)/d logp_t = -s1 * 2 / |y| = -s1
    assert logp.grad.tolist() == pytest.approx([-s1, -s1, 0.0, 0.0, 0.0])


def test_cispo_clips_the_weight_not_the_gradient() -> None:
    # Ratios [1.5, 0.5, 1.1], eps_low 0.2, eps_high 0.28 -> weights sg[clip(r)] = [1.28, 0.8, 1.1].
    # log pi = [-1, -2, -0.5], A = [1, -1, 2]; loss = -w*A*log pi = [1.28, -1.6, 1.1];
    # gradient -w*A = [-1.28, 0.8, -2.2] (every token keeps a gradient, unlike PPO's clipped ones).
    logp = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    old = logp.detach() - torch.log(torch.tensor([1.5, 0.5, 1.1]))
    out = cispo_loss(logp, old, torch.tensor([1.0, -1.0, 2.0]), 0.2, 0.28)
    assert out.loss.tolist() == pytest.approx([1.28, -1.6, 1.1])
    assert out.clipped.tolist() == [1.0, 1.0, 0.0]
    out.loss.sum().backward()
    assert logp.grad.tolist() == pytest.approx([-1.28, 0.8, -2.2])


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
    # d/d(logp) of k1 = 1; of k2 = d; of k3 = 1 - exp(-d). At d = ln 2: 1, ln 2 and 0.5.
    for kl_type, grad in [("k2", math.log(2)), ("k3", 0.5), ("low_var_kl", 0.5), ("k1", 1.0)]:
        logp = torch.tensor([math.log(2.0)], requires_grad=True)
        kl_estimate(logp, torch.tensor([0.0]), kl_type).sum().backward()
        assert logp.grad.item() == pytest.approx(grad), kl_type


def test_low_var_kl_clamps_extreme_values() -> None:
    # As slime and verl: the estimate itself is clamped to [-10, 10]. d = -5: k3 = exp(5) - 1 - 5 = 142.4 -> 10,
    # with no gradient through the clamp; d = -2: k3 = exp(2) - 3 = 4.389 stays, gradient 1 - exp(2).
    logp = torch.tensor([-5.0, -2.0], requires_grad=True)
    got = kl_estimate(logp, torch.tensor([0.0, 0.0]), "low_var_kl")
    assert got.tolist() == pytest.approx([10.0, math.exp(2) - 3])
    got.sum().backward()
    assert logp.grad.tolist() == pytest.approx([0.0, 1 - math.exp(2)])
    assert kl_estimate(torch.tensor([-5.0]), torch.tensor([0.0]), "k3").item() == pytest.approx(math.exp(5) - 6)
    assert kl_estimate(torch.tensor([0.3]), torch.tensor([0.3]), "k3").item() == 0.0


def test_unbiased_kl_ratio_applies_before_the_low_var_clamp() -> None:
    # d = logp - ref = -3: k3 = e^3 - 1 - 3 = 16.0855; times the ratio 2 it is 32.17, which low_var_kl clamps to
    # 10 while k3 keeps it (slime multiplies by the ratio first, then clamps low_var_kl only).
    lp, ref, ratio = torch.tensor([-4.0]), torch.tensor([-1.0]), torch.tensor([2.0])
    k3 = math.exp(3) - 4
    assert kl_estimate(lp, ref, "k3", ratio).item() == pytest.approx(2 * k3)
    assert kl_estimate(lp, ref, "low_var_kl", ratio).item() == pytest.approx(10.0)
    assert kl_estimate(lp, ref, "k2", ratio).item() == pytest.approx(2 * 4.5)
