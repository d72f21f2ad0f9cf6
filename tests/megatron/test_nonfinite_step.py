"""A NaN/inf loss or gradient skips the optimizer step on real Megatron (fp32, CPU): reported, never applied."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from tests.megatron.common import fixed_batch, num_targets, token_ce_loss


@pytest.fixture
def engine(tiny_qwen3, megatron_world):
    """A fresh engine (training changes its weights)."""
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.optimizer import OptimizerSettings

    return MegatronTrainEngine(tiny_qwen3, OptimizerSettings(lr=1e-3), max_tokens_per_micro_batch=40)


def nan_loss(logprobs: list[torch.Tensor], data: list) -> torch.Tensor:
    """A loss that is NaN (as a reward or advantage gone NaN makes it)."""
    return sum(lp.sum() for lp in logprobs) * float("nan")


def nan_gradient(logprobs: list[torch.Tensor], data: list) -> torch.Tensor:
    """A finite loss (0) whose gradient is NaN: d sqrt(x)/dx at 0 is inf, times 0."""
    return torch.sqrt(sum(lp.sum() for lp in logprobs) * 0.0)


def weights(engine) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in engine.export_hf_weights()}


def test_nonfinite_loss_or_gradient_skips_the_step(engine, caplog: pytest.LogCaptureFixture) -> None:
    seqs = fixed_batch()
    before = weights(engine)
    lr = engine.optimizer.param_groups[0]["lr"]
    for n, loss_fn in enumerate((nan_loss, nan_gradient), start=1):
        with caplog.at_level(logging.WARNING, logger="slime_like.trainer.megatron.engine"):
            m = engine.train_step(seqs, [None] * len(seqs), loss_fn)
        assert m["update_successful"] == 0.0 and m["skipped_steps"] == 1.0 and math.isnan(m["grad_norm"])
        assert engine.skipped_steps_total == n and f"{n} step(s) skipped so far" in caplog.text
        after = weights(engine)
        assert all(torch.equal(before[k], after[k]) for k in before)  # not applied
        assert engine.optimizer.param_groups[0]["lr"] == lr
    assert "optimizer step skipped: the loss or a gradient is not finite" in caplog.text
    # The next good step trains normally: no NaN was left in the gradients or the optimizer state.
    m = engine.train_step(seqs, [None] * len(seqs), token_ce_loss(num_targets(seqs)))
    assert m["update_successful"] == 1.0 and m["skipped_steps"] == 0.0 and 0 < m["grad_norm"] < math.inf
    after = weights(engine)
    assert all(torch.isfinite(t).all() for t in after.values())
    assert any(not torch.equal(before[k], after[k]) for k in before)
