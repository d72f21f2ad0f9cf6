"""Megatron dist_checkpointing (torch_dist) save/load of model, optimizer, scheduler and RNG resumes exactly."""

from __future__ import annotations

import pytest

from tests.megatron.common import fixed_batch, num_targets, token_ce_loss


@pytest.mark.parametrize("distributed_optimizer", [True, False])
def test_resume_from_checkpoint_repeats_the_same_steps(distributed_optimizer, tiny_qwen3, megatron_world, tmp_path):
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.optimizer import OptimizerSettings

    settings = OptimizerSettings(
        lr=1e-3,
        weight_decay=0.01,
        lr_warmup_steps=1,
        lr_decay_steps=10,
        lr_decay_style="cosine",
        use_distributed_optimizer=distributed_optimizer,
    )
    seqs = fixed_batch()
    loss_fn = token_ce_loss(num_targets(seqs))
    first = MegatronTrainEngine(tiny_qwen3, settings, max_tokens_per_micro_batch=40)
    for _ in range(2):
        first.train_step(seqs, [None] * len(seqs), loss_fn)
    first.save_checkpoint(tmp_path / "ckpt")
    expected = [first.train_step(seqs, [None] * len(seqs), loss_fn) for _ in range(2)]

    resumed = MegatronTrainEngine(tiny_qwen3, settings, max_tokens_per_micro_batch=40)
    resumed.load_checkpoint(tmp_path / "ckpt")
    got = [resumed.train_step(seqs, [None] * len(seqs), loss_fn) for _ in range(2)]
    assert got == expected
