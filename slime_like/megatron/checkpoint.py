"""Save and load model, optimizer, LR scheduler and RNG states with Megatron distributed checkpointing.

The format is Megatron's torch_dist with Megatron's top-level keys ("model" or "model{i}" per virtual
pipeline chunk, "optimizer", "opt_param_scheduler", "rng_state"), written directly into `directory`.
The distributed optimizer uses the "dp_reshardable" layout: a checkpoint can be loaded with another
DP size but the same TP/PP. A model-only checkpoint (tools/convert_hf_to_torch_dist.py writes one) loads
at any TP/PP/EP; into an engine with an optimizer it sets the weights and leaves the optimizer fresh.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

import torch

from slime_like.megatron.cpu_compat import cuda_to_cpu

logger = logging.getLogger(__name__)
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


def _sharded_state_dict(model, optimizer, scheduler, is_loading: bool, rng: bool = True) -> dict:
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
    if rng:
        state["rng_state"] = _rng_state(is_loading)
    return state


def model_sharded_state_dict(model: list[torch.nn.Module]) -> dict:
    """The model part of a checkpoint's sharded state dict (what a weights-only load reads)."""
    return _sharded_state_dict(model, None, None, is_loading=True, rng=False)


def save_checkpoint(
    directory: str | Path, model: list[torch.nn.Module], optimizer=None, scheduler=None, rng: bool = True
) -> None:
    """Collectively save all states of this rank into directory (created).

    rng=False (with no optimizer) writes a model-only checkpoint, loadable at any parallel layout.
    """
    from megatron.core import dist_checkpointing

    Path(directory).mkdir(parents=True, exist_ok=True)
    with cuda_to_cpu():
        state = _sharded_state_dict(model, optimizer, scheduler, is_loading=False, rng=rng)
        metadata = {**_OPTIM_METADATA, "has_rng_state": rng}
        dist_checkpointing.save(state, str(directory), content_metadata=metadata)
    torch.distributed.barrier()


def has_optimizer_state(directory: str | Path) -> bool:
    """Whether a torch_dist checkpoint holds optimizer and scheduler states (not only the model)."""
    from megatron.core import dist_checkpointing

    return "opt_param_scheduler" in dist_checkpointing.load_common_state_dict(str(directory))


def load_checkpoint(
    directory: str | Path, model: list[torch.nn.Module], optimizer=None, scheduler=None, weights_only: bool = False
) -> None:
    """Collectively load what save_checkpoint wrote into the model (and optimizer, scheduler, RNG).

    weights_only=True loads the model alone (RNG states are per TP/PP rank: they need the saved layout).
    """
    from mbridge.core.util import unwrap_model
    from megatron.core import dist_checkpointing, tensor_parallel

    metadata = dist_checkpointing.load_content_metadata(str(directory)) or {}
    rng = not weights_only and metadata.get("has_rng_state", True)
    fresh_optimizer = None
    if optimizer is not None and (weights_only or not has_optimizer_state(directory)):
        logger.info("loading only the model weights of %s: the optimizer starts fresh", directory)
        fresh_optimizer, optimizer, scheduler = optimizer, None, None
    with cuda_to_cpu(), torch.no_grad():  # loading copies into views of parameters
        if optimizer is not None:
            _init_empty_optimizer_state(optimizer)
        state = _sharded_state_dict(model, optimizer, scheduler, is_loading=True, rng=rng)
        loaded = dist_checkpointing.load(state, str(directory))
        chunks = unwrap_model(model)
        for i, chunk in enumerate(chunks):
            chunk.load_state_dict(loaded["model" if len(chunks) == 1 else f"model{i}"])
        if optimizer is not None:
            optimizer.load_state_dict(loaded["optimizer"])
            _restore_adam_steps(optimizer)
            scheduler.load_state_dict(loaded["opt_param_scheduler"])
        if fresh_optimizer is not None:
            fresh_optimizer.reload_model_params()  # its fp32 main copies follow the loaded weights
    if rng:
        states = loaded["rng_state"]
        random.setstate(states["random"])
        torch.set_rng_state(states["torch"])
        if states["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state(states["cuda"])
        tensor_parallel.get_cuda_rng_tracker().set_states(states["tracker"])
