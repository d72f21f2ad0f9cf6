"""The RL step of a trainer rank on real Megatron: each objective, the PPO critic, SFT and the hooks."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from slime_like.trainer.algorithms.advantages import AdvantageInputs
from tests.megatron.algo_common import actor_args, make_data


@pytest.fixture
def make_actor(tiny_qwen3: Path, megatron_world: None, monkeypatch: pytest.MonkeyPatch):
    from slime_like.trainer.actor import TrainActor

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, os.environ.get(key, "0"))  # TrainActor sets them; restored after the test
    return lambda *flags: TrainActor(actor_args(tiny_qwen3, list(flags)), 0, "127.0.0.1", 0)


def near_rollout_log_probs(actor) -> list[list[float]]:
    """The model's own log-probs, shifted by 0.05 (one token by 2.0), as SGLang's would be."""
    data = make_data()
    full = actor.engine.forward_logprobs(data.tokens)
    out = [(lp[-n:] + 0.05).tolist() for lp, n in zip(full, data.response_lengths, strict=True)]
    out[0][0] += 2.0
    return out


def test_first_step_ratio_one_then_kl_grows(make_actor) -> None:
    actor = make_actor(
        "--use-kl-loss", "--kl-loss-coef", "0.1", "--kl-loss-type", "low_var_kl", "--global-batch-size", "8"
    )
    first = actor.train(0, make_data())
    # Old log-probs are recomputed with the same weights: ratio exactly 1, nothing clipped, KL to ref 0.
    assert first["train/ppo_ratio_abs_dev"] == 0.0
    assert first["train/pg_clipfrac"] == 0.0
    assert first["train/kl_loss"] == 0.0
    assert first["train/grad_norm"] > 0
    # GRPO: rewards 1/0 in groups 0, 1, 3: mean 0.5, unbiased std sqrt(0.5), so A = +-0.5/sqrt(0.5) = +-1/sqrt(2);
    # 0 in group 2 (0.5/0.5). Token mean over 19 loss tokens: group 0: 2*(+a) + 3*(-a); group 1: 3*(+a) (one
    # token masked) + 2*(-a); group 3: 3*(-a) + 2*(+a) -> -a/19 with a = 1/sqrt(2).
    assert first["train/advantage_mean"] == pytest.approx(-1 / (19 * math.sqrt(2)), abs=1e-5)
    second = actor.train(1, make_data())
    # After one update the policy has left the reference: the KL term is positive (k3 >= 0).
    assert second["train/kl_loss"] > 0
    assert second["train/ppo_ratio_abs_dev"] == 0.0  # still on-policy within the rollout's single step


def test_mismatch_metrics_and_masked_is(make_actor) -> None:
    actor = make_actor("--advantage-estimator", "gspo", "--eps-clip-c", "3", "--use-mis", "--mis-level", "token")
    m = actor.train(0, make_data(near_rollout_log_probs(actor)))
    # 19 loss tokens: 18 shifted by 0.05 (rho = exp(-0.05), inside [0.5, 2]) and one by 2.05 (outside).
    assert m["train/train_rollout_logprob_abs_diff"] == pytest.approx((18 * 0.05 + 2.05) / 19, abs=1e-4)
    k3 = lambda d: math.exp(d) - 1 - d  # noqa: E731  (KL(mu || pi) per token, d = log pi - log mu)
    assert m["train/train_rollout_kl"] == pytest.approx((18 * k3(-0.05) + k3(-2.05)) / 19, abs=1e-4)
    assert m["train/train_rollout_out_of_band_frac"] == pytest.approx(1 / 19)
    assert m["train/is_dropped_frac"] == pytest.approx(1 / 19)
    assert m["train/grad_norm"] > 0


@pytest.mark.parametrize(
    "flags",
    [
        ["--advantage-estimator", "cispo", "--use-tis", "--eps-clip-high", "0.28"],
        ["--advantage-estimator", "reinforce_plus_plus_baseline", "--kl-coef", "0.1", "--use-decoupled-loss",
         "--behav-imp-weight-cap", "1.5", "--loss-agg-mode", "seq-mean-token-sum-norm"],
        ["--advantage-estimator", "rloo", "--use-rollout-logprobs", "--loss-agg-mode", "seq-mean-token-sum",
         "--overlong-buffer-len", "3"],
        ["--advantage-estimator", "reinforce_plus_plus", "--gamma", "0.9"],
    ],
    ids=["cispo-tis", "rpp-baseline-decoupled", "rloo-rollout-logprobs-overlong", "rpp"],
)  # fmt: skip
def test_objectives_take_a_step(make_actor, flags: list[str]) -> None:
    actor = make_actor(*flags)
    before = {k: v.clone() for k, v in actor.engine.export_hf_weights()}
    m = actor.train(0, make_data(near_rollout_log_probs(actor)))
    assert all(math.isfinite(v) for v in m.values())
    assert m["train/grad_norm"] > 0 and m["train/update_successful"] == 1.0
    after = dict(actor.engine.export_hf_weights())
    assert any(not torch.equal(before[k], after[k]) for k in before)
    if "--overlong-buffer-len" in flags:
        # Budget 8, buffer 3: responses longer than 5 tokens are penalised; lengths 2,3,4,2,3,1,4,2 -> none.
        assert m["train/overlong_penalty_mean"] == 0.0


def test_ppo_critic_warm_up_then_policy(make_actor) -> None:
    actor = make_actor("--advantage-estimator", "ppo", "--num-critic-only-steps", "6", "--critic-lr", "5e-3")
    # The critic's trunk is the policy's HF weights; only its head (zero-initialised) is new.
    critic = dict(actor.critic.model[0].module.named_parameters())
    policy = dict(actor.engine.model[0].module.named_parameters())
    emb = "embedding.word_embeddings.weight"
    assert torch.equal(critic[emb], policy[emb])
    assert critic["output_layer.weight"].shape == (1, critic[emb].shape[1])
    before = {k: v.clone() for k, v in actor.engine.export_hf_weights()}
    losses = []
    for rollout in range(6):  # critic only: the same batch, fixed returns (gamma = lambda = 1: R)
        m = actor.train(rollout, make_data())
        assert not any(k.startswith("train/grad_norm") for k in m)
        losses.append(m["critic/value_loss"])
    # Shared first-token states of a group with rewards 1 and 0 leave a floor of ~0.04 (6 tokens * 0.125 / 19).
    assert losses[-1] < 0.5 * losses[0] and losses[-1] < min(losses[:3]), losses
    assert all(torch.equal(before[k], v) for k, v in actor.engine.export_hf_weights())
    m = actor.train(6, make_data())  # warm-up over: the policy trains too
    assert m["train/grad_norm"] > 0 and "critic/value_loss" in m


def test_sft_loss_falls_with_multi_turn_masks(make_actor) -> None:
    actor = make_actor("--loss-type", "sft_loss", "--lr", "1e-2")
    nll = [actor.train(i, make_data())["train/sft_nll"] for i in range(4)]
    assert nll[-1] < nll[0] - 0.5, nll


def my_advantages(args, inputs: AdvantageInputs) -> list[torch.Tensor]:
    """A custom estimator for the hook test: the raw reward minus 0.5 on every loss token."""
    return [(r - 0.5) * m for r, m in zip(inputs.rewards, inputs.loss_masks, strict=True)]


def my_loss(args, log_probs, entropy, batch):
    """A custom loss for the hook test: REINFORCE, -A * log pi per token, and the mean log-prob."""
    return [-a * lp for lp, a in zip(log_probs, batch.advantages, strict=True)], {"logp": log_probs}


def test_custom_hooks(make_actor) -> None:
    actor = make_actor(
        "--custom-advantage-function-path", "tests.megatron.test_actor.my_advantages",
        "--loss-type", "custom_loss", "--custom-loss-function-path", "tests.megatron.test_actor.my_loss",
    )  # fmt: skip
    m = actor.train(0, make_data())
    # Rewards 1/0/0.5 -> advantages +-0.5 and 0: their token mean over the 19 loss tokens.
    # +0.5 on samples 0 (2 tokens), 2 (3 of 4), 7 (2); -0.5 on 1 (3), 3 (2), 6 (3 of 4): (7 - 8) * 0.5 / 19.
    assert m["train/advantage_mean"] == pytest.approx(-0.5 / 19, abs=1e-6)
    assert m["train/logp"] < 0 and m["train/grad_norm"] > 0
