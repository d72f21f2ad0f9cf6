"""Save and load model, optimizer, LR scheduler and RNG states with Megatron distributed checkpointing.

The format is Megatron's torch_dist with Megatron's top-level keys ("model" or "model{i}" per virtual
pipeline chunk, "optimizer", "opt_param_scheduler", "rng_state"), written directly into `directory`.
The distributed optimizer uses the "dp_reshardable" layout: a checkpoint can be loaded with another
DP size but the same TP/PP.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from slime_like.megatron.cpu_compat import cuda_to_cpu

_OPTIM_METADATA = {"distrib_optim_sharding_type": "dp_reshardable"}


def _rng_state(is_loading: bool):
    """This rank's RNG states as a ShardedObject, one per (PP, TP) rank and replicated over DP."""
    from megatron.core import parallel_state as mpu
    from megatron.core import tensor_parallel
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    state = None
    if not is_loading:
        state = {
            "random": random.getstate(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
            "tracker": tensor_parallel.get_cuda_rng_tracker().get_states(),
        }
    pp, tp = mpu.get_pipeline_model_parallel_rank(), mpu.get_tensor_model_parallel_rank()
    shape = (mpu.get_pipeline_model_parallel_world_size(), mpu.get_tensor_model_parallel_world_size())
    return ShardedObject("rng_state", state, shape, (pp, tp), replica_id=mpu.get_data_parallel_rank())


def _init_empty_optimizer_state(optimizer) -> None:
    """Give a fresh torch Adam its state tensors: Megatron reads "step" from them before loading."""
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = opt.optimizer
        for group in inner.param_groups:
            for p in group["params"]:
                if not inner.state[p]:
                    zeros = torch.zeros_like(p.data)
                    inner.state[p] = {"step": torch.tensor(0.0), "exp_avg": zeros, "exp_avg_sq": zeros.clone()}


def _restore_adam_steps(optimizer) -> None:
    """Set torch Adam's per-param "step" from the loaded param groups.

    Megatron's dp_reshardable load copies each param's "step" from a non-persistent local object,
    i.e. back to its pre-load value (only the apex/TE Adam keeps no per-param step).
    """
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = opt.optimizer
        for group in inner.param_groups:
            if group.get("step") is None:
                continue
            for p in group["params"]:
                if "step" in inner.state[p]:
                    inner.state[p]["step"] = torch.tensor(float(group["step"]))


def _sharded_state_dict(model, optimizer, scheduler, is_loading: bool) -> dict:
    from mbridge.core.util import unwrap_model

    chunks = unwrap_model(model)
    state: dict = {}
    if len(chunks) == 1:
        state["model"] = chunks[0].sharded_state_dict()
    else:
        for i, chunk in enumerate(chunks):
            state[f"model{i}"] = chunk.sharded_state_dict()
    if optimizer is not None:
        state["optimizer"] = optimizer.sharded_state_dict(state, is_loading=is_loading, metadata=_OPTIM_METADATA)
        state["opt_param_scheduler"] = scheduler.state_dict()
    state["rng_state"] = _rng_state(is_loading)
    return state


def save_checkpoint(directory: str | Path, model: list[torch.nn.Module], optimizer=None, scheduler=None) -> None:
    """Collectively save all states of this rank into directory (created)."""
    from megatron.core import dist_checkpointing

    Path(directory).mkdir(parents=True, exist_ok=True)
    with cuda_to_cpu():
        state = _sharded_state_dict(model, optimizer, scheduler, is_loading=False)
        dist_checkpointing.save(state, str(directory), content_metadata=_OPTIM_METADATA)
    torch.distributed.barrier()


def load_checkpoint(directory: str | Path, model: list[torch.nn.Module], optimizer=None, scheduler=None) -> None:
    """Collectively load what save_checkpoint wrote into the model (and optimizer, scheduler, RNG)."""
    from mbridge.core.util import unwrap_model
    from megatron.core import dist_checkpointing, tensor_parallel

    with cuda_to_cpu(), torch.no_grad():  # loading copies into views of parameters
        if optimizer is not None:
            _init_empty_optimizer_state(optimizer)
        state = _sharded_state_dict(model, optimizer, scheduler, is_loading=True)
        loaded = dist_checkpointing.load(state, str(directory))
        chunks = unwrap_model(model)
        for i, chunk in enumerate(chunks):
            chunk.load_state_dict(loaded["model" if len(chunks) == 1 else f"model{i}"])
        if optimizer is not None:
            optimizer.load_state_dict(loaded["optimizer"])
            _restore_adam_steps(optimizer)
            scheduler.load_state_dict(loaded["opt_param_scheduler"])
    rng = loaded["rng_state"]
    random.setstate(rng["random"])
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
    tensor_parallel.get_cuda_rng_tracker().set_states(rng["tracker"])
