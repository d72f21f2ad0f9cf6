"""Advantage estimators, returns, GAE, value loss and overlong shaping against hand-computed values."""

from __future__ import annotations

import argparse
import math

import pytest
import torch

from slime_like.trainer.algorithms.advantages import AdvantageInputs, Advantages, compute_advantages
from slime_like.trainer.algorithms.dapo import overlong_penalty
from slime_like.trainer.algorithms.grpo import grpo_advantages, normalize_group_rewards
from slime_like.trainer.algorithms.ppo import gae, value_loss
from slime_like.trainer.algorithms.reinforce_pp import reinforce_pp_advantages
from slime_like.trainer.algorithms.returns import discounted_returns, masked_whiten, shaped_token_rewards
from slime_like.trainer.algorithms.rloo import rloo_advantages

EPS = 1e-6  # GRPO's std epsilon


def test_grpo_normalisation_hand_computed() -> None:
    # rewards [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(((.5)^2*4)/3) = 1/sqrt(3) -> +-0.5*sqrt(3) = +-0.866
    # (slime, verl and TRL take torch.std, unbiased; the population std would give +-1).
    h = 0.5 * math.sqrt(3)
    assert normalize_group_rewards([1, 0, 0, 1], eps=0) == pytest.approx([h, -h, -h, h], abs=1e-12)
    # A group of one: no spread to divide by; its advantage is 0.
    assert normalize_group_rewards([0.7]) == [0.0]
    # Zero variance: all zero, no division by zero.
    assert normalize_group_rewards([1, 1, 1]) == [0.0, 0.0, 0.0]


def test_grpo_and_dr_grpo_with_interleaved_groups() -> None:
    rewards, groups = [1.0, 0.0, 3.0, 0.0, 0.0, 1.0], [0, 0, 1, 1, 1, 0]
    # group 0 = rows 0, 1, 5 with rewards [1, 0, 1]: mean 2/3, deviations [1/3, -2/3, 1/3],
    # unbiased std sqrt((1/9 + 4/9 + 1/9) / 2) = sqrt(1/3).
    s0 = math.sqrt(1 / 3)
    # group 1 = rows 2, 3, 4 with rewards [3, 0, 0]: mean 1, deviations [2, -1, -1], std sqrt(6/2) = sqrt(3).
    s1 = math.sqrt(3)
    expected = [(1 / 3) / (s0 + EPS), (-2 / 3) / (s0 + EPS), 2 / (s1 + EPS), -1 / (s1 + EPS), -1 / (s1 + EPS)]
    expected.append((1 / 3) / (s0 + EPS))
    assert grpo_advantages(rewards, groups) == pytest.approx(expected)
    # Dr.GRPO: centred only.
    assert grpo_advantages(rewards, groups, use_std=False) == pytest.approx([1 / 3, -2 / 3, 2, -1, -1, 1 / 3])
    # A group whose rewards are all equal, and a group of one, teach nothing: A = 0.
    assert grpo_advantages([0.5, 0.5, 1.0], [0, 0, 1]) == [0.0, 0.0, 0.0]


def test_rloo_leave_one_out() -> None:
    # group [1, 0, 3]: A_0 = 1 - (0 + 3)/2 = -0.5, A_1 = 0 - (1 + 3)/2 = -2, A_2 = 3 - (1 + 0)/2 = 2.5.
    # A group of one sample has no baseline: 0.
    assert rloo_advantages([1.0, 0.0, 3.0, 7.0], [0, 0, 0, 1]) == pytest.approx([-0.5, -2.0, 2.5, 0.0])
    # Equal rewards: 0 for everyone.
    assert rloo_advantages([2.0, 2.0], [0, 0]) == [0.0, 0.0]


def test_kl_shaped_returns_skip_tool_tokens() -> None:
    # Response of 4 tokens, token 2 written by a tool (mask 0). kl = [0.1, 0.2, 5.0, 0.3], beta 0.5,
    # gamma 0.9, reward 1. Action rewards: r0 = -0.05, r1 = -0.1, r3 = -0.15 + 1 = 0.85; r2 = 0.
    mask = torch.tensor([1.0, 1.0, 0.0, 1.0])
    rewards = shaped_token_rewards(1.0, mask, torch.tensor([0.1, 0.2, 5.0, 0.3]), 0.5)
    assert rewards.tolist() == pytest.approx([-0.05, -0.1, 0.0, 0.85])
    # Returns over action tokens: G3 = 0.85, G1 = -0.1 + 0.9*0.85 = 0.665, G0 = -0.05 + 0.9*0.665 = 0.5485.
    assert discounted_returns(rewards, mask, 0.9).tolist() == pytest.approx([0.5485, 0.665, 0.0, 0.85])


def test_masked_whiten_over_all_rows() -> None:
    # Values over masked tokens: [1, 2, 3] (row 0, last entry padding) and [6] (row 1):
    # mean 3, population variance (4 + 1 + 0 + 9)/4 = 3.5.
    values = [torch.tensor([1.0, 2.0, 3.0, 100.0]), torch.tensor([6.0])]
    masks = [torch.tensor([1.0, 1.0, 1.0, 0.0]), torch.tensor([1.0])]
    sd = math.sqrt(3.5 + 1e-8)
    out = masked_whiten(values, masks)
    assert out[0].tolist() == pytest.approx([-2 / sd, -1 / sd, 0.0, 0.0])
    assert out[1].tolist() == pytest.approx([3 / sd])


def test_reinforce_pp_and_baseline() -> None:
    # REINFORCE++: row 0 as in test_kl_shaped_returns_skip_tool_tokens (returns [0.5485, 0.665, -, 0.85]),
    # row 1: reward 0, no KL, returns [0, 0]. Whitened over the 5 action tokens.
    masks = [torch.tensor([1.0, 1.0, 0.0, 1.0]), torch.tensor([1.0, 1.0])]
    kls = [torch.tensor([0.1, 0.2, 5.0, 0.3]), torch.zeros(2)]
    adv, returns = reinforce_pp_advantages([1.0, 0.0], masks, kls, 0.5, 0.9)
    g = [0.5485, 0.665, 0.85, 0.0, 0.0]
    mean = sum(g) / 5
    sd = math.sqrt(sum((x - mean) ** 2 for x in g) / 5 + 1e-8)
    assert adv[0].tolist() == pytest.approx([(0.5485 - mean) / sd, (0.665 - mean) / sd, 0.0, (0.85 - mean) / sd])
    assert adv[1].tolist() == pytest.approx([-mean / sd, -mean / sd])
    assert returns[0].tolist() == pytest.approx([0.5485, 0.665, 0.0, 0.85])
    # REINFORCE++-baseline: rewards [1, 0] of one group -> centred [0.5, -0.5]; one token each, no KL,
    # gamma 1: returns [0.5], [-0.5]; whitened: mean 0, variance 0.25 -> +-0.5/sqrt(0.25 + 1e-8) ~ +-1.
    one = [torch.ones(1), torch.ones(1)]
    adv, _ = reinforce_pp_advantages([1.0, 0.0], one, None, 0.0, 1.0, group_ids=[0, 0])
    assert [a.item() for a in adv] == pytest.approx([1.0, -1.0], abs=1e-6)


def test_gae_hand_computed_with_tool_token() -> None:
    # Action tokens 0, 2, 3 (token 1 is a tool's; its value 9.9 must be ignored). Values at actions
    # [0.5, 0.2, 0.8], reward 1 on the last action, gamma 0.9, lambda 0.8:
    # delta_3 = 1 + 0 - 0.8 = 0.2;             A_3 = 0.2
    # delta_2 = 0 + 0.9*0.8 - 0.2 = 0.52;      A_2 = 0.52 + 0.72*0.2 = 0.664
    # delta_0 = 0 + 0.9*0.2 - 0.5 = -0.32;     A_0 = -0.32 + 0.72*0.664 = 0.15808
    # returns = A + V = [0.65808, -, 0.864, 1.0]
    mask = torch.tensor([1.0, 0.0, 1.0, 1.0])
    values = torch.tensor([0.5, 9.9, 0.2, 0.8])
    adv, ret = gae(shaped_token_rewards(1.0, mask), values, mask, 0.9, 0.8)
    assert adv.tolist() == pytest.approx([0.15808, 0.0, 0.664, 0.2])
    assert ret.tolist() == pytest.approx([0.65808, 0.0, 0.864, 1.0])
    # gamma = lambda = 1 is Monte Carlo: A_t = R - V_t.
    adv, _ = gae(shaped_token_rewards(1.0, mask), values, mask, 1.0, 1.0)
    assert adv.tolist() == pytest.approx([0.5, 0.0, 0.8, 0.2])


def test_value_loss_clipping_both_sides() -> None:
    # V_old = 1, return R = 2, clip 0.2, loss 0.5 * max((V - R)^2, (V_old + clip(V - V_old) - R)^2):
    # V = 1.5: max(0.25, (1.2 - 2)^2 = 0.64) -> 0.32, clipped (no gradient)
    # V = 1.1: max(0.81, 0.81) -> 0.405, unclipped, gradient V - R = -0.9
    # V = 0.5: max(2.25, (0.8 - 2)^2 = 1.44) -> 1.125, unclipped, gradient -1.5
    # V = 2.6, R = 2 via old 1: max(0.36, (1.2 - 2)^2 = 0.64) -> 0.32, clipped (overshoot above)
    v = torch.tensor([1.5, 1.1, 0.5, 2.6], requires_grad=True)
    loss, clipped = value_loss(v, torch.ones(4), torch.full((4,), 2.0), 0.2)
    assert loss.tolist() == pytest.approx([0.32, 0.405, 1.125, 0.32])
    assert clipped.tolist() == [1.0, 0.0, 0.0, 1.0]
    loss.sum().backward()
    assert v.grad.tolist() == pytest.approx([0.0, -0.9, -1.5, 0.0])
    plain, _ = value_loss(torch.tensor([1.5]), torch.ones(1), torch.full((1,), 2.0), None)
    assert plain.item() == pytest.approx(0.125)


def test_overlong_penalty() -> None:
    # L_max 20, buffer 5: no penalty up to 15; (15 - |y|)/5 inside the buffer; -1 beyond L_max.
    assert overlong_penalty(15, 20, 5) == 0.0
    assert overlong_penalty(16, 20, 5) == pytest.approx(-0.2)
    assert overlong_penalty(20, 20, 5) == pytest.approx(-1.0)
    assert overlong_penalty(21, 20, 5) == -1.0
    assert overlong_penalty(18, 20, 5, factor=0.5) == pytest.approx(-0.3)


def _args(**kw) -> argparse.Namespace:
    base = dict(
        advantage_estimator="grpo",
        disable_grpo_std_normalization=False,
        normalize_advantages=False,
        kl_coef=0.0,
        gamma=1.0,
        lambd=1.0,
    )
    return argparse.Namespace(**{**base, **kw})


def _inputs(**kw) -> AdvantageInputs:
    masks = [torch.tensor([1.0, 1.0, 0.0]), torch.tensor([1.0, 0.0, 0.0])]
    base = dict(rewards=[1.0, 0.0], group_ids=[0, 0], loss_masks=masks, log_probs=[torch.zeros(3)] * 2)
    return AdvantageInputs(**{**base, **kw})


def test_compute_advantages_dispatch_and_whitening() -> None:
    # GRPO on [1, 0]: mean 0.5, unbiased std sqrt(0.5) -> +-0.5/(sqrt(0.5) + eps) on loss tokens, 0 on padding.
    s = math.sqrt(0.5)
    a = compute_advantages(_args(), _inputs()).advantages
    assert a[0].tolist() == pytest.approx([0.5 / (s + EPS)] * 2 + [0.0])
    assert a[1].tolist() == pytest.approx([-0.5 / (s + EPS), 0.0, 0.0])
    # Whitened over the 3 loss tokens [x, x, -x]: mean x/3, so the result is [1, 1, -2]/sqrt(2) (scale free).
    w = compute_advantages(_args(normalize_advantages=True), _inputs()).advantages
    assert w[0][:2].tolist() == pytest.approx([1 / math.sqrt(2)] * 2)
    assert w[1][0].item() == pytest.approx(-2 / math.sqrt(2))
    # ppo with --kl-coef: token rewards -0.5*(logp - ref) = -0.5*0.2 = -0.1 on actions, + R on the last;
    # values 0, gamma = lambda = 1: A_t = sum of the remaining rewards.
    ppo = _args(advantage_estimator="ppo", kl_coef=0.5)
    inputs = _inputs(ref_log_probs=[torch.full((3,), -0.2)] * 2, values=[torch.zeros(3)] * 2)
    out = compute_advantages(ppo, inputs)
    assert out.advantages[0].tolist() == pytest.approx([0.8, 0.9, 0.0])
    assert out.advantages[1].tolist() == pytest.approx([-0.1, 0.0, 0.0])
    assert out.returns[0].tolist() == pytest.approx([0.8, 0.9, 0.0])


def test_custom_advantage_hook() -> None:
    def hook(args, inputs: AdvantageInputs):
        return [m * r for m, r in zip(inputs.loss_masks, inputs.rewards, strict=True)]

    out = compute_advantages(_args(), _inputs(), custom=hook)
    assert isinstance(out, Advantages)
    assert out.advantages[0].tolist() == [1.0, 1.0, 0.0]
    assert out.advantages[1].tolist() == [0.0, 0.0, 0.0]


def test_disable_rewards_normalization_hand_computed() -> None:
    # slime's --disable-rewards-normalization: grpo takes the raw rewards [3, 1] as the advantage (no mean, no
    # std), on the loss tokens only.
    raw = _args(rewards_normalization=False)
    a = compute_advantages(raw, _inputs(rewards=[3.0, 1.0])).advantages
    assert a[0].tolist() == pytest.approx([3.0, 3.0, 0.0])
    assert a[1].tolist() == pytest.approx([1.0, 0.0, 0.0])
    # reinforce_plus_plus_baseline drops its group baseline. Two groups of one sample each: with the baseline
    # (the default) both rewards become 0 and so does every advantage; without it the returns are the raw rewards
    # [3, 3] and [1] (gamma 1, no KL) on the 3 loss tokens, whitened: mean 7/3, variance ((2/3)^2 * 2 + (4/3)^2)/3.
    two_groups = _inputs(rewards=[3.0, 1.0], group_ids=[0, 1])
    base = compute_advantages(_args(advantage_estimator="reinforce_plus_plus_baseline"), two_groups).advantages
    assert [x.tolist() for x in base] == [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    rpp = _args(advantage_estimator="reinforce_plus_plus_baseline", rewards_normalization=False)
    b = compute_advantages(rpp, two_groups).advantages
    sd = math.sqrt(((2 / 3) ** 2 * 2 + (4 / 3) ** 2) / 3 + 1e-8)
    assert b[0].tolist() == pytest.approx([(2 / 3) / sd, (2 / 3) / sd, 0.0], rel=1e-5)
    assert b[1].tolist() == pytest.approx([(-4 / 3) / sd, 0.0, 0.0], rel=1e-5)
