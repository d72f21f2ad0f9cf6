"""The engine's loss functions on hand-made batches: shares add up over micro-batches, gradients by hand."""

from __future__ import annotations

import argparse
import math

import pytest
import torch

from slime_like.trainer.algorithms.loss import custom_loss_fn, policy_loss_fn, sft_loss_fn, value_loss_fn
from tests.loss_batch import loss_batch


def _args(**kw) -> argparse.Namespace:
    base = dict(
        advantage_estimator="grpo",
        eps_clip=0.2,
        eps_clip_high=0.2,
        eps_clip_c=None,
        entropy_coef=0.0,
        use_kl_loss=False,
        kl_loss_coef=0.0,
        kl_loss_type="k1",
        value_clip=0.2,
    )
    return argparse.Namespace(**{**base, **kw})


def test_policy_loss_entropy_and_kl_by_hand() -> None:
    # One sample: prompt of 2 tokens -> the engine gives 3 log-probs, the last 2 are the response.
    # old = current (ratio 1), A = [1, -1], token-mean weights [0.5, 0.5], entropy [2, 1] with coef 0.1,
    # k1 KL loss with coef 0.2 against ref = logp - 0.3 (KL 0.3 per token). Per token:
    #   l = -A*r - 0.1*H + 0.2*0.3 = [-1 - 0.2 + 0.06, 1 - 0.1 + 0.06] = [-1.14, 0.96]; loss = -0.09.
    # d loss/d logp = 0.5 * (-A + 0.2) = [-0.4, 0.6]; d loss/d H = -0.1 * 0.5.
    lp = torch.tensor([-9.0, -1.0, -2.0], requires_grad=True)
    ent = torch.tensor([5.0, 2.0, 1.0], requires_grad=True)
    resp = lp.detach()[-2:]
    batch = loss_batch(
        [torch.ones(2)],
        old_log_probs=[resp.clone()],
        advantages=[torch.tensor([1.0, -1.0])],
        ref_log_probs=[resp - 0.3],
    )
    args = _args(entropy_coef=0.1, use_kl_loss=True, kl_loss_coef=0.2)
    loss, stats = policy_loss_fn(args)([lp], batch, [ent])
    assert loss.item() == pytest.approx(-0.09)
    loss.backward()
    assert lp.grad.tolist() == pytest.approx([0.0, -0.4, 0.6])
    assert ent.grad.tolist() == pytest.approx([0.0, -0.05, -0.05])
    assert stats["kl_loss"] == pytest.approx(0.3)
    assert stats["entropy"] == pytest.approx(1.5)
    assert stats["pg_clipfrac"] == 0.0


def test_is_weight_scales_the_policy_term() -> None:
    # IS weights [2, 0]: pg per token = w * (-A * r) = [2 * -1, 0 * 1] = [-2, 0]; loss = 0.5 * -2 = -1.
    lp = torch.tensor([-1.0, -2.0], requires_grad=True)
    batch = loss_batch(
        [torch.ones(2)],
        old_log_probs=[lp.detach().clone()],
        advantages=[torch.tensor([1.0, -1.0])],
        is_weights=[torch.tensor([2.0, 0.0])],
    )
    loss, _ = policy_loss_fn(_args())([lp], batch, [torch.zeros(2)])
    assert loss.item() == pytest.approx(-1.0)
    loss.backward()
    assert lp.grad.tolist() == pytest.approx([-1.0, 0.0])


def test_micro_batch_shares_add_up_to_the_whole_step() -> None:
    # Three samples with padding; the seq-mean-token-mean weights come from the whole step, so the loss of
    # micro-batches [0, 1] and [2] adds up to the loss of the step in one micro-batch (any DP split).
    torch.manual_seed(0)
    masks = [torch.tensor([1.0, 1.0, 0.0]), torch.tensor([1.0]), torch.tensor([1.0, 1.0, 1.0, 1.0])]
    lps = [torch.randn(len(m) + 1) for m in masks]
    batch = loss_batch(
        masks,
        "seq-mean-token-mean",
        old_log_probs=[lp[1:] + 0.1 * torch.randn(len(lp) - 1) for lp in lps],
        advantages=[torch.randn(len(m)) for m in masks],
    )
    ents = [torch.rand(len(lp)) for lp in lps]
    fn = policy_loss_fn(_args(entropy_coef=0.01, eps_clip_c=3.0))
    whole, whole_stats = fn(lps, batch, ents)
    a, a_stats = fn(lps[:2], batch.select([0, 1]), ents[:2])
    b, b_stats = fn(lps[2:], batch.select([2]), ents[2:])
    assert (a + b).item() == pytest.approx(whole.item(), abs=1e-6)
    for key, value in whole_stats.items():
        assert a_stats[key] + b_stats[key] == pytest.approx(value, abs=1e-6), key


def test_gspo_micro_batch_gives_each_sample_its_sequence_ratio() -> None:
    # Sample 1: log-ratios [0.1, 0.1] -> s = exp(0.1) inside the band, A = 1: loss -s per token.
    # Sample 2: log-ratios [0.4] -> s = exp(0.4) = 1.49 > 1.2, A = 1: clipped, -1.2. Token-mean over 3 tokens:
    # (-2 exp(0.1) - 1.2) / 3, and the clip fraction is 1/3.
    lps = [torch.tensor([-5.0, 0.1, 0.1]), torch.tensor([-5.0, 0.4])]
    batch = loss_batch(
        [torch.ones(2), torch.ones(1)],
        old_log_probs=[torch.zeros(2), torch.zeros(1)],
        advantages=[torch.ones(2), torch.ones(1)],
    )
    loss, stats = policy_loss_fn(_args(advantage_estimator="gspo"))(lps, batch, [torch.zeros(3), torch.zeros(2)])
    assert loss.item() == pytest.approx((-2 * math.exp(0.1) - 1.2) / 3)
    assert stats["pg_clipfrac"] == pytest.approx(1 / 3)


def test_sft_loss_is_masked_nll() -> None:
    # Response log-probs [-2, -3, -4] with the middle token masked (a user turn): token-mean NLL (2 + 4)/2 = 3.
    lp = torch.tensor([-1.0, -2.0, -3.0, -4.0], requires_grad=True)
    batch = loss_batch([torch.tensor([1.0, 0.0, 1.0])])
    loss, stats = sft_loss_fn()([lp], batch)
    assert loss.item() == pytest.approx(3.0)
    assert stats["sft_nll"] == pytest.approx(3.0)
    loss.backward()
    assert lp.grad.tolist() == pytest.approx([0.0, -0.5, 0.0, -0.5])


def test_value_loss_fn_token_mean() -> None:
    # Values [1.1, 5.0 (padding)] vs return 2 from old 1 (clip 0.2): 0.5 * 0.81 on the one real token.
    values = torch.tensor([0.0, 1.1, 5.0], requires_grad=True)
    batch = loss_batch([torch.tensor([1.0, 0.0])], old_values=[torch.ones(2)], returns=[torch.full((2,), 2.0)])
    loss, stats = value_loss_fn(_args())([values], batch)
    assert loss.item() == pytest.approx(0.405)
    assert stats["values"] == pytest.approx(1.1)


def test_custom_loss_hook_is_masked_and_aggregated() -> None:
    # The hook returns -A * log pi per token and a metric; padding (mask 0) must not count.
    def hook(args, log_probs, entropy, batch):
        losses = [-a * lp for lp, a in zip(log_probs, batch.advantages, strict=True)]
        return losses, {"lp": [lp.detach() for lp in log_probs]}

    lp = torch.tensor([-7.0, -1.0, -2.0, -3.0], requires_grad=True)
    batch = loss_batch([torch.tensor([1.0, 1.0, 0.0])], advantages=[torch.tensor([1.0, 2.0, 5.0])])
    loss, stats = custom_loss_fn(_args(), hook)([lp], batch, [torch.zeros(4)])
    # token-mean over 2 real tokens: (-1*-1 + -2*-2)/2 = 2.5; metric mean of log pi = -1.5.
    assert loss.item() == pytest.approx(2.5)
    assert stats["lp"] == pytest.approx(-1.5)
