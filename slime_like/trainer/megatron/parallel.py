"""Start torch.distributed and Megatron's parallel state (TP/PP/CP/EP/VPP; DP is what is left).

Sequence parallel is kept here too: it is a choice about how TP ranks split activations, made once per
process with the sizes, and read by the model provider (model.make_bridge) when it builds the config.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import nullcontext
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from slime_like.core.process import free_port
from slime_like.trainer.megatron.cpu_compat import ON_CUDA, apply_cpu_compat, seed_all, transformer_engine_available

_SEQUENCE_PARALLEL = False


def init_distributed(timeout_minutes: int = 10, gpu_backend: str = "nccl") -> None:
    """Initialise the default process group from RANK/WORLD_SIZE/MASTER_* (a world of 1 if unset); `gpu_backend` on
    CUDA (--distributed-backend), gloo on CPU."""
    if dist.is_initialized():
        return
    backend = gpu_backend if ON_CUDA else "gloo"
    timeout = timedelta(minutes=timeout_minutes)
    if ON_CUDA:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend=backend, timeout=timeout)
    else:
        # A private world of one; the environment stays untouched for child processes.
        init_method = f"tcp://127.0.0.1:{free_port()}"
        dist.init_process_group(backend=backend, init_method=init_method, rank=0, world_size=1, timeout=timeout)


def init_parallel(
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    etp: int | None = None,
    vpp: int | None = None,
    seed: int = 1234,
    cp: int = 1,
    sequence_parallel: bool = False,
    reloadable_groups: bool = False,
    timeout_minutes: int = 10,
    gpu_backend: str = "nccl",
) -> None:
    """Initialise torch.distributed, Megatron parallel state (idempotent for equal sizes) and seeds.

    Context parallel (cp > 1) initialises here on any device; building a model with it needs Transformer
    Engine (make_bridge says so). Sequence parallel is checked here, before anything starts.
    reloadable_groups: Megatron's groups can be destroyed and rebuilt (reloadable_groups.py; --offload-train
    uses it to free NCCL's memory during rollout).
    timeout_minutes, gpu_backend: of the default process group (--distributed-timeout-minutes, --distributed-backend).
    """
    from megatron.core import parallel_state as mpu

    global _SEQUENCE_PARALLEL
    sequence_parallel = sequence_parallel and tp > 1  # Megatron-LM: no TP ranks, no sequence parallel
    check_sequence_parallel(sequence_parallel, tp)
    apply_cpu_compat()
    init_distributed(timeout_minutes, gpu_backend)
    if mpu.model_parallel_is_initialized():
        same = (
            mpu.get_tensor_model_parallel_world_size() == tp
            and mpu.get_pipeline_model_parallel_world_size() == pp
            and mpu.get_expert_model_parallel_world_size() == ep
            and mpu.get_context_parallel_world_size() == cp
        )
        if not same:
            raise RuntimeError("Megatron parallel state already initialised with other sizes")
    else:
        from slime_like.trainer.megatron.reloadable_groups import enable_reloadable_groups

        with enable_reloadable_groups() if reloadable_groups else nullcontext():
            mpu.initialize_model_parallel(
                tensor_model_parallel_size=tp,
                pipeline_model_parallel_size=pp,
                virtual_pipeline_model_parallel_size=vpp,
                context_parallel_size=cp,
                expert_model_parallel_size=ep,
                expert_tensor_parallel_size=etp,
            )
    _SEQUENCE_PARALLEL = sequence_parallel
    seed_all(seed)


def check_sequence_parallel(sequence_parallel: bool, tp: int) -> None:
    """Refuse sequence parallel where it cannot run: TP > 1 without Transformer Engine.

    With TP 1 there is nothing to split; the argument check has turned the flag off (as Megatron-LM does), and
    init_parallel keeps it off for callers that pass it anyway.
    """
    if not sequence_parallel or tp < 2:
        return
    if not transformer_engine_available():
        raise ValueError(
            "--sequence-parallel needs CUDA with Transformer Engine (Megatron's local layer norms, the CPU "
            "path, refuse it): drop the flag, or run on GPUs with transformer-engine installed (pip install '.[gpu]')"
        )


def sequence_parallel_enabled() -> bool:
    """Whether init_parallel was asked for sequence parallel (read when the model config is built)."""
    return _SEQUENCE_PARALLEL


def destroy_parallel() -> None:
    """Tear down Megatron parallel state and the default process group."""
    from megatron.core import parallel_state as mpu

    global _SEQUENCE_PARALLEL
    _SEQUENCE_PARALLEL = False
    mpu.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def share_from_last_stage(local: Any, merge: Callable[[list[Any]], Any], over_dp: bool = True) -> Any:
    """Merge picklable per-rank results of the last pipeline stage over DP (over_dp=False: this rank's alone);
    return them on every rank of the pipeline."""
    from megatron.core import parallel_state as mpu

    merged = None
    if mpu.is_pipeline_last_stage(ignore_virtual=True):
        parts: list[Any] = [local]
        if over_dp and mpu.get_data_parallel_world_size() > 1:  # no pickling when there is nobody to share with
            parts = [None] * mpu.get_data_parallel_world_size()
            dist.all_gather_object(parts, local, group=mpu.get_data_parallel_group())
        merged = merge(parts)
    if mpu.get_pipeline_model_parallel_world_size() > 1:
        box = [merged]
        src = mpu.get_pipeline_model_parallel_last_rank()
        dist.broadcast_object_list(box, src=src, group=mpu.get_pipeline_model_parallel_group())
        merged = box[0]
    return merged
