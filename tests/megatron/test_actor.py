"""The RL step of a trainer rank on real Megatron: ratio 1 on the first step, KL to the reference."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from buffer.train_data import TrainData
from slime_like.arguments import parse_args


def make_data() -> TrainData:
    """Four sequences: prompt of 3 tokens, responses of 2-4 tokens, rewards +-1."""
    tokens = [[5, 6, 7, 20, 21], [5, 6, 7, 22, 23, 24], [8, 9, 10, 25, 26, 27, 28], [8, 9, 10, 29, 30]]
    lengths = [len(t) - 3 for t in tokens]
    return TrainData(
        tokens=tokens,
        response_lengths=lengths,
        loss_masks=[[1] * n for n in lengths],
        raw_rewards=[1.0, 0.0, 1.0, 0.0],
        rewards=[1.0, -1.0, 1.0, -1.0],
        rollout_log_probs=[[-6.0] * n for n in lengths],
        sample_indices=[0, 1, 2, 3],
        weight_versions=[0] * 4,
    )


@pytest.fixture
def actor(tiny_qwen3: Path, tmp_path: Path, megatron_world: None, monkeypatch: pytest.MonkeyPatch):
    from slime_like.actor import TrainActor

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, os.environ.get(key, "0"))  # restored after the test
    args = parse_args(
        ["--hf-checkpoint", str(tiny_qwen3), "--prompt-data", "x.jsonl", "--rollout-batch-size", "2",
         "--n-samples-per-prompt", "2", "--num-rollout", "2", "--lr", "1e-2", "--use-kl-loss",
         "--kl-loss-coef", "0.1", "--kl-loss-type", "low_var_kl", "--max-tokens-per-gpu", "12"]
    )  # fmt: skip
    return TrainActor(args, 0, "127.0.0.1", 0)


def test_first_step_ratio_one_then_kl_grows(actor) -> None:
    first = actor.train(0, make_data())
    # Old log-probs are recomputed with the same weights: ratio exactly 1, nothing clipped, KL to ref 0.
    assert first["train/ppo_ratio_abs_dev"] == 0.0
    assert first["train/pg_clipfrac"] == 0.0
    assert first["train/kl_loss"] == 0.0
    assert first["train/grad_norm"] > 0
    # The rollout log-probs given (-6) are far from the model's: the mismatch metric shows it.
    assert first["train/train_rollout_logprob_abs_diff"] > 0.1
    second = actor.train(1, make_data())
    # After one update the policy has left the reference: the KL term is positive (k3 >= 0).
    assert second["train/kl_loss"] > 0
    assert second["train/ppo_ratio_abs_dev"] == 0.0  # still on-policy within the rollout's single step
