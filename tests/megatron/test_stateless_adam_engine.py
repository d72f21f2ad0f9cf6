"""slime's --use-stateless-adam on a real trainer rank: Megatron's (distributed) optimizer steps with StatelessAdam
and keeps no moments; each step moves a weight by at most the learning rate."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.megatron.algo_common import actor_args, make_data


@pytest.mark.parametrize("extra", [[], ["--no-use-distributed-optimizer"]])
def test_the_trainer_steps_without_moments(
    extra: list[str], tiny_qwen3: Path, megatron_world: None, monkeypatch
) -> None:
    from slime_like.trainer.actor import TrainActor
    from slime_like.trainer.megatron.stateless_adam import StatelessAdam

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, os.environ.get(key, "0"))
    actor = TrainActor(actor_args(tiny_qwen3, ["--use-stateless-adam", "--no-save-optim", *extra]), 0, "127.0.0.1", 0)
    optimizer = actor.engine.optimizer
    parts = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    assert all(isinstance(part.optimizer, StatelessAdam) for part in parts)
    before = actor._snapshot()
    metrics = actor.train(0, make_data())  # two optimizer steps at --lr 1e-2
    assert metrics["train/grad_norm"] > 0
    assert all(not part.optimizer.state for part in parts)  # no exp_avg / exp_avg_sq anywhere
    moved = max(float((v - before[k]).abs().max()) for k, v in actor._snapshot().items() if v.is_floating_point())
    assert 0.0 < moved <= 2 * 1e-2 * (1 + 1e-4)  # |lr * g / (|g| + eps)| <= lr per step
