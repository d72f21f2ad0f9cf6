"""Save and load model, optimizer, LR scheduler and RNG states with Megatron distributed checkpointing.

The format is Megatron-LM's torch_dist, as slime writes it: the top-level keys "model" (or "model{i}" per
virtual pipeline chunk), "optimizer", "opt_param_scheduler", "rng_state" (Megatron-LM's list of RNG dicts),
"iteration" and "checkpoint_version", and Megatron-LM's content metadata, written into `directory`. The
distributed optimizer uses the "dp_reshardable" layout: a checkpoint can be loaded with another DP size but
the same TP/PP. A model-only checkpoint (tools/convert_hf_to_torch_dist.py writes one) loads at any
TP/PP/EP; into an engine with an optimizer it sets the weights and leaves the optimizer fresh.

Loading follows the checkpoint's own content metadata (a checkpoint of Megatron-LM or slime loads too);
optimizer and RNG states are loaded only when the checkpoint holds them for this engine's optimizer and
parallel layout, and a log line says when they are not. Model tensors the checkpoint lacks, or holds in
another shape, stop the load with an error naming them.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from slime_like.trainer.megatron.cpu_compat import cuda_to_cpu

logger = logging.getLogger(__name__)
# Megatron-LM's content metadata with the distributed optimizer's default layout
# (training/checkpointing.py::_build_sharded_state_dict_metadata): the same keys as a checkpoint of slime.
_METADATA = {
    "distrib_optim_sharding_type": "dp_reshardable",
    "singleton_local_shards": False,
    "chained_optim_avoid_prefix": True,
}
_CHECKPOINT_VERSION = 3.0  # Megatron-LM's, read by its loader


class CheckpointMismatchError(ValueError):
    """A checkpoint that does not hold this model (missing tensors, other shapes); the message lists them."""


def _rng_state(is_loading: bool):
    """This rank's RNG states as Megatron-LM saves them: a list of one dict, a ShardedObject per (PP, TP) rank
    replicated over DP, or per (PP, TP, DP) rank with expert parallelism."""
    from megatron.core import parallel_state as mpu
    from megatron.core import tensor_parallel
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    state = None
    if not is_loading:
        state = [
            {
                "random_rng_state": random.getstate(),
                "np_rng_state": np.random.get_state(),
                "torch_rng_state": torch.get_rng_state(),
                "cuda_rng_state": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
                "rng_tracker_states": tensor_parallel.get_cuda_rng_tracker().get_states(),
            }
        ]
    pp, tp = mpu.get_pipeline_model_parallel_rank(), mpu.get_tensor_model_parallel_rank()
    shape = (mpu.get_pipeline_model_parallel_world_size(), mpu.get_tensor_model_parallel_world_size())
    dp = mpu.get_data_parallel_rank(with_context_parallel=True)
    if mpu.get_expert_model_parallel_world_size() > 1:
        dp_size = mpu.get_data_parallel_world_size(with_context_parallel=True)
        return ShardedObject("rng_state", state, (*shape, dp_size), (pp, tp, dp), replica_id=0)
    return ShardedObject("rng_state", state, shape, (pp, tp), replica_id=dp)


def _set_rng_state(saved: list[dict[str, Any]]) -> None:
    """Restore what _rng_state saved (one dict per DP rank when Megatron-LM saved them all)."""
    from megatron.core import parallel_state as mpu
    from megatron.core import tensor_parallel

    states = saved[0] if len(saved) == 1 else saved[mpu.get_data_parallel_rank()]
    random.setstate(states["random_rng_state"])
    np.random.set_state(states["np_rng_state"])
    torch.set_rng_state(states["torch_rng_state"])
    if states.get("cuda_rng_state") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda_rng_state"])
    tensor_parallel.get_cuda_rng_tracker().set_states(states["rng_tracker_states"])


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


def _sharded_state_dict(
    model,
    optimizer,
    scheduler,
    is_loading: bool,
    rng: bool = True,
    metadata: dict | None = None,
    only: Callable[[str], bool] | None = None,
) -> dict:
    from mbridge.core.util import unwrap_model

    metadata = _METADATA if metadata is None else metadata
    chunks = unwrap_model(model)
    state: dict = {}
    for i, chunk in enumerate(chunks):
        part = chunk.sharded_state_dict(metadata=dict(metadata))  # copies: Megatron adds groups
        if only is not None:  # a part of the model (e.g. its LoRA adapters): the optimizer must hold no other
            part = {k: v for k, v in part.items() if only(k)}
        state["model" if len(chunks) == 1 else f"model{i}"] = part
    if optimizer is not None:
        state["optimizer"] = optimizer.sharded_state_dict(state, is_loading=is_loading, metadata=dict(metadata))
        state["opt_param_scheduler"] = scheduler.state_dict()
    if rng:
        state["rng_state"] = _rng_state(is_loading)
    return state


def model_sharded_state_dict(model: list[torch.nn.Module]) -> dict:
    """The model part of a checkpoint's sharded state dict (what a weights-only load reads)."""
    return _sharded_state_dict(model, None, None, is_loading=True, rng=False)


def save_checkpoint(
    directory: str | Path,
    model: list[torch.nn.Module],
    optimizer=None,
    scheduler=None,
    rng: bool = True,
    iteration: int = 0,
    only: Callable[[str], bool] | None = None,
) -> None:
    """Collectively save all states of this rank into directory (created); `iteration` is recorded as
    Megatron-LM records it.

    rng=False (with no optimizer) writes a model-only checkpoint, loadable at any parallel layout.
    only: the model state-dict keys to save (all when None), e.g. a LoRA adapter's (lora_slots.py); the optimizer
    must update no parameter outside them.
    """
    from megatron.core import dist_checkpointing

    Path(directory).mkdir(parents=True, exist_ok=True)
    with cuda_to_cpu():
        state = _sharded_state_dict(model, optimizer, scheduler, is_loading=False, rng=rng, only=only)
        state.update(iteration=iteration, checkpoint_version=_CHECKPOINT_VERSION)
        metadata = {**_METADATA, "has_rng_state": rng}
        dist_checkpointing.save(state, str(directory), content_metadata=metadata)
    torch.distributed.barrier()


def has_optimizer_state(directory: str | Path) -> bool:
    """Whether a torch_dist checkpoint holds optimizer and scheduler states (not only the model)."""
    from megatron.core import dist_checkpointing

    return "opt_param_scheduler" in dist_checkpointing.load_common_state_dict(str(directory))


def _sharded_items(state: Any):
    """The ShardedTensors and ShardedObjects of a sharded state dict, nested at any depth."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor

    if isinstance(state, dict):
        for value in state.values():
            yield from _sharded_items(value)
    elif isinstance(state, list | tuple):
        for value in state:
            yield from _sharded_items(value)
    elif isinstance(state, ShardedTensor | ShardedObject):
        yield state


def _mismatches(stored: dict, sharded_state: Any) -> list[str]:
    """What of sharded_state the checkpoint (its sharded metadata) lacks or holds in another global shape.

    Tensors are stored under their key, objects under their unique key (key/shard_<offset>_<shape>).
    """
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    problems = []
    for value in _sharded_items(sharded_state):
        if isinstance(value, ShardedObject):
            if value.unique_key not in stored:
                other = next((k for k in stored if k.startswith(value.key + "/shard_")), None)
                problems.append(
                    f"{value.key} is not in the checkpoint"
                    if other is None
                    else f"{value.key}: the checkpoint has {other}, this layout needs {value.unique_key}"
                )
        elif value.key not in stored:
            problems.append(f"{value.key} is not in the checkpoint")
        elif tuple(stored[value.key].global_shape) != tuple(value.global_shape):
            problems.append(
                f"{value.key}: the checkpoint has shape {tuple(stored[value.key].global_shape)}, this model "
                f"{tuple(value.global_shape)}"
            )
    return problems


def _all_ranks(problems: list[str]) -> list[str]:
    """The problems found on any rank (every rank checks its own shards): the same answer everywhere."""
    gathered: list[list[str] | None] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, problems)
    return sorted({p for part in gathered for p in part or []})


def load_checkpoint(
    directory: str | Path,
    model: list[torch.nn.Module],
    optimizer=None,
    scheduler=None,
    weights_only: bool = False,
    load_optimizer: bool = True,
    load_rng: bool = True,
    only: Callable[[str], bool] | None = None,
) -> None:
    """Collectively load a torch_dist checkpoint into the model (and optimizer, scheduler, RNG when it holds
    them for this engine); ours or one of Megatron-LM/slime.

    weights_only=True loads the model alone (RNG states are per TP/PP rank: they need the saved layout);
    load_optimizer=False leaves the optimizer fresh, load_rng=False keeps this process's RNG states.
    only: the model state-dict keys to load (save_checkpoint's); the other parameters keep their values.
    """
    from mbridge.core.util import unwrap_model
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import load_sharded_metadata

    directory = str(directory)
    common = dist_checkpointing.load_common_state_dict(directory)
    metadata = dict(dist_checkpointing.load_content_metadata(preloaded_state_dict=common) or {})
    saved_rng = metadata.pop("has_rng_state", True)
    stored = load_sharded_metadata(directory)
    skipped = None  # why the optimizer state is not loaded
    if optimizer is not None and (weights_only or not load_optimizer):
        skipped = "model weights asked for"
    elif optimizer is not None and "opt_param_scheduler" not in common:
        skipped = "the checkpoint holds no optimizer state"
    with cuda_to_cpu(), torch.no_grad():  # loading copies into views of parameters
        if optimizer is not None and skipped is None:
            _init_empty_optimizer_state(optimizer)
        state = _sharded_state_dict(
            model,
            optimizer if skipped is None else None,
            scheduler,
            is_loading=True,
            rng=False,
            metadata=metadata,
            only=only,
        )
        model_state = {k: v for k, v in state.items() if k.startswith("model")}
        problems = _all_ranks(_mismatches(stored, model_state))
        if problems:
            raise CheckpointMismatchError(
                f"{directory} does not hold this model (another model or config, or another Megatron layer spec):"
                "\n  " + "\n  ".join(problems[:20])
            )
        if "optimizer" in state:
            problems = _all_ranks(_mismatches(stored, state["optimizer"]))
            if problems:
                skipped = f"its optimizer state does not fit this optimizer: {problems[0]}"
                del state["optimizer"], state["opt_param_scheduler"]
        rng = not weights_only and load_rng and saved_rng
        if rng:
            state["rng_state"] = _rng_state(is_loading=True)
            if _all_ranks(_mismatches(stored, state["rng_state"])):  # none, or of another TP/PP: as Megatron-LM
                logger.info("%s: no RNG states for this parallel layout, not loaded", directory)
                rng = False
                del state["rng_state"]
        loaded = dist_checkpointing.load(state, directory)
        chunks = unwrap_model(model)
        for i, chunk in enumerate(chunks):
            chunk.load_state_dict(loaded["model" if len(chunks) == 1 else f"model{i}"], strict=only is None)
        if skipped is None and optimizer is not None:
            optimizer.load_state_dict(loaded["optimizer"])
            _restore_adam_steps(optimizer)
            scheduler.load_state_dict(loaded["opt_param_scheduler"])
        elif optimizer is not None:
            logger.info("loaded only the model weights of %s (%s): the optimizer starts fresh", directory, skipped)
            optimizer.reload_model_params()  # its fp32 main copies follow the loaded weights
    if rng:
        _set_rng_state(loaded["rng_state"])
