"""slime's loss options on hand-made batches, each against hand-computed values: --use-unbiased-kl, --use-opsm,
--custom-tis-function-path and --custom-pg-loss-reducer-function-path (slime's signatures)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest
import torch

from slime_like.trainer.algorithms.loss import policy_loss_fn
from slime_like.trainer.algorithms.opsm import opsm_keep
from tests.loss_batch import loss_batch

HOOKS = '''
import torch


def tis(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths, response_lengths, **kw):
    """Rejects tokens whose ratio is above 1.5, weighs the rest by the ratio (slime's TIS contract)."""
    ratios = [torch.exp(t - r) for t, r in zip(train_log_probs, rollout_log_probs)]
    kept = [(x <= 1.5).float() * m for x, m in zip(ratios, loss_masks)]
    ratio = torch.cat(ratios)
    assert total_lengths == [5] and response_lengths == [2]
    return pg_loss * ratio.clamp(max=1.5) * torch.cat(kept), kept, {"my_ratio": ratio}


def token_sum(total_lengths, response_lengths, loss_masks, calculate_per_token_loss):
    """Each sample's token sum instead of its token mean (slime's reducer contract)."""

    def reduce(x):
        return sum((part * m).sum() for part, m in zip(x.split(response_lengths), loss_masks))

    return reduce
'''


@pytest.fixture
def hooks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "slime_loss_hooks_under_test.py").write_text(HOOKS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "slime_loss_hooks_under_test"


def _args(**kw) -> argparse.Namespace:
    base = dict(
        advantage_estimator="grpo", eps_clip=0.2, eps_clip_high=0.2, eps_clip_c=None, entropy_coef=0.0,
        use_kl_loss=False, kl_loss_coef=0.0, kl_loss_type="k1", use_opsm=False, opsm_delta=1e-4,
        use_unbiased_kl=False, custom_tis_function_path=None, custom_pg_loss_reducer_function_path=None,
        calculate_per_token_loss=False, loss_agg_mode="seq-mean-token-mean",
    )  # fmt: skip
    return argparse.Namespace(**{**base, **kw})


def test_unbiased_kl_weighs_by_the_ratio_with_its_gradient() -> None:
    # One response of 2 tokens, advantage 0 (no policy-gradient term), k1 KL loss with coefficient 1, token mean.
    # d = logp - ref = [0.5, 0.5]; ratio = exp(logp - old) = [e^0.2, e^-0.5]; KL = ratio * d.
    # loss = 0.5 * 0.5 * (e^0.2 + e^-0.5); d/dlogp (ratio * d) = ratio * (d + 1) -> 0.5 * 1.5 * ratio per token.
    lp = torch.tensor([-1.0, -2.0], requires_grad=True)
    batch = loss_batch(
        [torch.ones(2)], "token-mean", old_log_probs=[torch.tensor([-1.2, -1.5])], advantages=[torch.zeros(2)],
        ref_log_probs=[torch.tensor([-1.5, -2.5])],
    )  # fmt: skip
    args = _args(use_kl_loss=True, kl_loss_coef=1.0, use_unbiased_kl=True)
    loss, stats = policy_loss_fn(args)([lp], batch, [torch.zeros(2)])
    assert loss.item() == pytest.approx(0.25 * (math.exp(0.2) + math.exp(-0.5)))
    loss.backward()
    assert lp.grad.tolist() == pytest.approx([0.75 * math.exp(0.2), 0.75 * math.exp(-0.5)])
    # Without the flag the k1 KL is 0.5 per token and its gradient 0.5 per token.
    lp2 = lp.detach().clone().requires_grad_(True)
    plain, _ = policy_loss_fn(_args(use_kl_loss=True, kl_loss_coef=1.0))([lp2], batch, [torch.zeros(2)])
    plain.backward()
    assert plain.item() == pytest.approx(0.5) and lp2.grad.tolist() == pytest.approx([0.5, 0.5])


def test_opsm_masks_negative_advantages_of_drifted_sequences() -> None:
    # Three responses of 2 tokens. Drift = mean(log pi_old - log pi): 0.5, 0.5, -1.
    # 0: drift 0.5 > 1e-4 and A = -1: masked.  1: same drift, A = +1: kept.  2: A = -1 but drift -1: kept.
    old = [torch.tensor([-1.0, -1.0]), torch.tensor([-1.0, -1.0]), torch.tensor([-2.0, -2.0])]
    lp = torch.tensor([-1.5, -1.5, -1.5, -1.5, -1.0, -1.0])
    adv = [torch.tensor([-1.0, -1.0]), torch.tensor([1.0, 1.0]), torch.tensor([-1.0, -1.0])]
    keep = opsm_keep(lp, torch.cat(old), torch.cat(adv), torch.ones(6), [2, 2, 2], 1e-4)
    assert keep.tolist() == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    # PPO clip (eps 0.2), token mean over 6 tokens. Sample 1: ratio e^-0.5, A = 1 -> -e^-0.5 per token.
    # Sample 2: ratio e, A = -1 -> max(e, 1.2) = e per token. Sample 0 (masked) would add max(e^-0.5, 0.8) = 0.8.
    batch = loss_batch([torch.ones(2)] * 3, "token-mean", old_log_probs=old, advantages=adv)
    per_sample, zeros = list(lp.split(2)), [torch.zeros(2)] * 3
    loss, stats = policy_loss_fn(_args(use_opsm=True))(per_sample, batch, zeros)
    assert loss.item() == pytest.approx((2 * -math.exp(-0.5) + 2 * math.e) / 6)
    assert stats["opsm_clipfrac"] == pytest.approx(2 / 6)
    off, _ = policy_loss_fn(_args())(per_sample, batch, zeros)
    assert off.item() == pytest.approx((2 * 0.8 + 2 * -math.exp(-0.5) + 2 * math.e) / 6)


def test_custom_tis_function_rejects_tokens_and_keeps_the_normaliser(hooks: str) -> None:
    # One response of 2 tokens (prompt 3), ratio pi/pi_old 1, A = 1: pg = -1 per token. Rollout log-probs give
    # rho = pi_old / mu = [e^1, e^-0.5]: the hook rejects token 0 (rho > 1.5) and weighs token 1 by e^-0.5.
    # The per-sample token mean keeps its denominator 2 (as slime): loss = -e^-0.5 / 2.
    lp = torch.tensor([-1.0, -1.0], requires_grad=True)
    batch = loss_batch(
        [torch.ones(2)], "seq-mean-token-mean", old_log_probs=[torch.tensor([-1.0, -1.0])],
        advantages=[torch.ones(2)], rollout_log_probs=[torch.tensor([-2.0, -0.5])], total_lengths=[5],
    )  # fmt: skip
    args = _args(use_tis=True, custom_tis_function_path=f"{hooks}.tis")
    loss, stats = policy_loss_fn(args)([lp], batch, [torch.zeros(2)])
    assert loss.item() == pytest.approx(-math.exp(-0.5) / 2)
    assert stats["my_ratio"] == pytest.approx((math.e + math.exp(-0.5)) / 2)  # metrics over the pre-rejection tokens
    loss.backward()
    assert lp.grad.tolist() == pytest.approx([0.0, -math.exp(-0.5) / 2])


@pytest.mark.parametrize("per_token", [False, True])
def test_custom_pg_loss_reducer_is_scaled_as_slime_scales_it(hooks: str, per_token: bool) -> None:
    # Two responses, ratio 1, A = [1, 1] and [2] (the second's last token has mask 0): pg = [-1, -1], [-2, x].
    # The reducer sums each sample's tokens: -4. slime divides by the step's 2 samples (-2), or per token by its
    # 3 loss tokens (-4/3). Split into two micro-batches, the shares add up to the same.
    masks = [torch.ones(2), torch.tensor([1.0, 0.0])]
    mode = "token-mean" if per_token else "seq-mean-token-mean"
    old = [torch.tensor([-1.0, -1.0]), torch.tensor([-1.0, -1.0])]
    batch = loss_batch(masks, mode, old_log_probs=old, advantages=[torch.ones(2), torch.tensor([2.0, 7.0])],
                 total_lengths=[4, 4])  # fmt: skip
    args = _args(
        custom_pg_loss_reducer_function_path=f"{hooks}.token_sum", calculate_per_token_loss=per_token,
        loss_agg_mode=mode,
    )  # fmt: skip
    fn = policy_loss_fn(args)
    want = -4 / 3 if per_token else -2.0
    whole, _ = fn([torch.full((2,), -1.0)] * 2, batch, [torch.zeros(2)] * 2)
    assert whole.item() == pytest.approx(want)
    parts = [fn([torch.full((2,), -1.0)], batch.select([i]), [torch.zeros(2)])[0].item() for i in range(2)]
    assert sum(parts) == pytest.approx(want)
