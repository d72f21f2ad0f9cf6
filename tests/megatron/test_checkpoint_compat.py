"""Checkpoints users move over from slime: a Megatron-LM checkpoint loads (model, optimizer, RNG), the KL reference
comes from --ref-load, and our own iteration directory keeps the critic beside the policy."""

from __future__ import annotations

import argparse
import logging
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from slime_like.trainer.megatron.checkpoint_layout import TRACKER, find_checkpoint
from tests.megatron.algo_common import actor_args, make_data
from tests.megatron.common import fixed_batch, num_targets, token_ce_loss
from tools import convert_hf_to_torch_dist


def save_as_megatron_lm(engine, directory: Path, iteration: int) -> None:
    """What Megatron-LM's save_checkpoint (training/checkpointing.py at the commit slime pins) writes with slime's
    forced settings: generate_state_dict's keys, its RNG list, its content metadata, torch_dist."""
    from mbridge.core.util import unwrap_model
    from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    from slime_like.trainer.megatron.cpu_compat import cuda_to_cpu

    content = {"distrib_optim_sharding_type": "dp_reshardable", "singleton_local_shards": False}
    content["chained_optim_avoid_prefix"] = True
    metadata = {**content, "dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True)}
    rng = {
        "random_rng_state": random.getstate(),
        "np_rng_state": np.random.get_state(),
        "torch_rng_state": torch.get_rng_state(),
        "cuda_rng_state": torch.zeros(16, dtype=torch.uint8),  # Megatron-LM runs on CUDA
        "rng_tracker_states": tensor_parallel.get_cuda_rng_tracker().get_states(),
    }
    args = argparse.Namespace(tensor_model_parallel_size=1, pipeline_model_parallel_size=1, num_layers=2)
    with cuda_to_cpu():
        state = {"args": args, "checkpoint_version": 3.0, "iteration": iteration}
        state["model"] = unwrap_model(engine.model)[0].sharded_state_dict(metadata=dict(metadata))
        state["optimizer"] = engine.optimizer.sharded_state_dict(state, metadata=dict(metadata))
        state["opt_param_scheduler"] = engine.scheduler.state_dict()
        state["rng_state"] = ShardedObject("rng_state", [rng], (1, 1), (0, 0), replica_id=0)
        state["num_floating_point_operations_so_far"] = 0
        directory.mkdir(parents=True)
        dist_checkpointing.save(state, str(directory), content_metadata=content)
    (directory.parent / TRACKER).write_text(str(iteration))


def test_slime_checkpoint_resumes_exactly(tiny_qwen3, megatron_world, tmp_path, caplog) -> None:
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.optimizer import OptimizerSettings

    seqs = fixed_batch()
    loss_fn = token_ce_loss(num_targets(seqs))
    slime = OptimizerSettings(lr=1e-3, lr_warmup_steps=1, lr_decay_steps=10, lr_decay_style="cosine")
    first = MegatronTrainEngine(tiny_qwen3, slime, max_tokens_per_micro_batch=40)
    for _ in range(2):
        first.train_step(seqs, [None] * len(seqs), loss_fn)
    save_as_megatron_lm(first, tmp_path / "iter_0000019", 19)
    saved = first.forward_logprobs(seqs)
    expected = [first.train_step(seqs, [None] * len(seqs), loss_fn) for _ in range(2)]

    checkpoint = find_checkpoint(tmp_path)
    assert checkpoint.iteration == 19 and checkpoint.state() is None
    # Same optimizer as slime's (distributed): weights, Adam moments, scheduler and RNG all carry over.
    resumed = MegatronTrainEngine(tiny_qwen3, slime, max_tokens_per_micro_batch=40)
    with caplog.at_level(logging.INFO, logger="slime_like.trainer.megatron.checkpoint"):
        resumed.load_checkpoint(checkpoint.directory)
    assert "not loaded" not in caplog.text and "starts fresh" not in caplog.text
    assert [resumed.train_step(seqs, [None] * len(seqs), loss_fn) for _ in range(2)] == expected
    # Our default (non-distributed) optimizer cannot take that state: the weights load, the optimizer starts fresh.
    plain = OptimizerSettings(lr=1e-3, use_distributed_optimizer=False)
    other = MegatronTrainEngine(tiny_qwen3, plain, max_tokens_per_micro_batch=40)
    with caplog.at_level(logging.INFO, logger="slime_like.trainer.megatron.checkpoint"):
        other.load_checkpoint(checkpoint.directory)
    assert "its optimizer state does not fit this optimizer" in caplog.text
    for got, want in zip(other.forward_logprobs(seqs), saved, strict=True):
        assert torch.equal(got, want)


@pytest.fixture
def make_actor(tiny_qwen3: Path, megatron_world: None, monkeypatch: pytest.MonkeyPatch):
    from slime_like.trainer.actor import TrainActor

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, os.environ.get(key, "0"))  # TrainActor sets them; restored after the test
    return lambda *flags: TrainActor(actor_args(tiny_qwen3, list(flags)), 0, "127.0.0.1", 0)


def test_ref_load_is_the_kl_reference_and_the_critic_saves_inside(make_actor, tiny_qwen3, tmp_path) -> None:
    from slime_like.trainer.megatron.checkpoint_conversion import copy_model_files, write_safetensors

    # Other weights, converted to Megatron-LM's release layout: the reference model of the run.
    donor = make_actor()
    donor.train(0, make_data())
    write_safetensors(donor.engine.export_hf_weights(), tmp_path / "other")
    copy_model_files(tiny_qwen3, tmp_path / "other")
    convert_hf_to_torch_dist.main(["--hf-checkpoint", str(tmp_path / "other"), "--save", str(tmp_path / "ref")])

    flags = ("--advantage-estimator", "ppo", "--kl-coef", "0.05", "--ref-load", str(tmp_path / "ref"))
    actor = make_actor(*flags)
    donor_weights = donor._snapshot()
    assert all(torch.equal(actor.ref_weights[k], donor_weights[k]) for k in donor_weights)
    fresh = make_actor()._snapshot()  # the policy itself starts from --hf-checkpoint
    assert all(torch.equal(v, fresh[k]) for k, v in actor._snapshot().items())
    data = make_data()
    ref_lp = actor._forward_with_weights(actor.ref_weights, data)
    assert any(not torch.equal(a, b) for a, b in zip(ref_lp, actor.engine.forward_logprobs(data.tokens), strict=True))

    # PPO's critic is saved inside the policy's iteration directory and comes back with it.
    actor.train(0, data)
    actor.save(str(tmp_path / "iter_0000000"), 0)
    assert (tmp_path / "iter_0000000" / "critic" / "metadata.json").exists()
    values = actor.critic.forward_values(data.tokens)
    again = make_actor(*flags)
    again.load(str(tmp_path / "iter_0000000"))
    for got, want in zip(again.critic.forward_values(data.tokens), values, strict=True):
        assert torch.equal(got, want)
