"""The trainer's GPU memory between the phases of a colocated run (--offload-train, torch_memory_saver).

Colocated, the SGLang servers and the trainer share each GPU. While the servers generate, the trainer's
weights, gradient buffers and optimizer states (everything the engines allocate inside
`TrainerOffload.region()`) leave the GPU: `offload()` pauses them (torch_memory_saver copies them to pinned
host memory and unmaps the physical pages; the virtual addresses stay reserved, so every tensor, view and
pointer Megatron holds stays valid) and `onload()` maps them again and copies the contents back.

Choices, and why:
- Hook mode "torch" (a CUDA pluggable allocator behind a private MemPool), not "preload" (the library in
  LD_PRELOAD of the process). The torch mode needs nothing set before the process starts, and pauses only
  what was made inside region(). slime runs the preload mode with TMS_INIT_ENABLE=1, where every cudaMalloc
  of the process is pausable, NCCL's own buffers included.
- NCCL's communicators are outside the region, so pausing never touches them; left alone they would keep
  their buffers on the GPU through the rollout. With `rebuild_groups` (on in the actor when --offload-train
  runs on CUDA), Megatron's process groups are reloadable (reloadable_groups.py: the Python group objects
  Megatron, DDP and the optimizer hold stay the same, the communicator inside is replaced): offload()
  destroys them after the pause, which frees NCCL's memory, and onload() creates them again before training
  resumes (NCCL connects lazily, at each group's first collective). Every rank offloads and onloads at the
  same point, as the rebuild needs. Not rebuilt: the default group (made by init_process_group) and groups
  asked for another backend (Megatron's gloo groups, which hold no GPU memory).
- CPU backup on: weights and optimizer states must come back bit-identical.
- Adam creates its moments at its first step, which runs outside the region: they would stay on the GPU.
  `materialize_optimizer_state` creates them inside the region, exactly as that first step would.
- Temporaries freed inside the region (e.g. the parameter storage Megatron's DDP moves into its contiguous
  buffer) stay cached in the region's pool: paused with the rest during rollout, reserved during training.
"""

from __future__ import annotations

import gc
import importlib.util
import inspect
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from slime_like.trainer.megatron.reloadable_groups import destroy_reloadable_groups, reload_reloadable_groups

logger = logging.getLogger(__name__)

PACKAGE = "torch_memory_saver"
INSTALL = "pip install torch_memory_saver"
TAG = "slime_like_train"
_GIB = 1024**3


def memory_saver_problem() -> str | None:
    """Why --offload-train cannot work on this CUDA machine (None when it can): checked at start-up."""
    if importlib.util.find_spec(PACKAGE) is None:
        return (
            f"--offload-train (on by default with --colocate on GPU) needs the {PACKAGE} package, which is not "
            f"installed: {INSTALL} (or pass --no-offload-train)"
        )
    if "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
        return (
            f"--offload-train: {PACKAGE} does not work with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; "
            "unset it (or pass --no-offload-train)"
        )
    return None


def _memory_saver() -> Any:
    """torch_memory_saver's process-wide saver, in the torch-allocator hook mode."""
    problem = memory_saver_problem()
    if problem:
        raise RuntimeError(problem)
    from torch_memory_saver import torch_memory_saver as saver

    if "enable_cpu_backup" not in inspect.signature(saver.region).parameters:
        raise RuntimeError(
            f"--offload-train needs a {PACKAGE} with region(enable_cpu_backup=...) and hook_mode 'torch' "
            f"(0.0.10 has both): pip install -U {PACKAGE}"
        )
    try:
        saver.hook_mode = "torch"  # only before its first use in this process
    except (AssertionError, AttributeError):
        logger.warning("%s was already in use in this process; keeping its hook mode", PACKAGE)
    return saver


def memory_snapshot() -> dict[str, float]:
    """The device's free and total memory (the driver's view) and what torch's allocator holds, in GiB."""
    free, total = torch.cuda.mem_get_info()
    return {
        "free": free / _GIB,
        "total": total / _GIB,
        "allocated": torch.cuda.memory_allocated() / _GIB,
        "reserved": torch.cuda.memory_reserved() / _GIB,
    }


def materialize_optimizer_state(optimizer: Any) -> int:
    """Create Adam's moments now (zeros, step 0: what its first step would create); returns the params set up.

    Run inside region() so the states are paused with the model. Training is unchanged: the first step finds
    the same zero state it would have made itself.
    """
    count = 0
    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner, init = getattr(part, "optimizer", None), getattr(part, "init_state_fn", None)
        if inner is None or init is None:
            continue
        fresh = [p for group in inner.param_groups for p in group["params"] if not inner.state[p]]
        if not fresh:
            continue
        init(inner, part.config)  # Megatron's own: zero exp_avg / exp_avg_sq per parameter
        if type(inner).__module__.startswith("torch.optim"):
            _add_torch_adam_steps(inner, fresh)
        count += len(fresh)
    return count


def _add_torch_adam_steps(inner: torch.optim.Optimizer, fresh: list[torch.Tensor]) -> None:
    """torch's Adam/AdamW keep a per-parameter step and expect it once a state exists (TE's keep it per group)."""
    fresh_ids = {id(p) for p in fresh}
    scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
    for group in inner.param_groups:
        on_device = group.get("capturable") or group.get("fused")
        for p in group["params"]:
            if id(p) not in fresh_ids:
                continue
            state = inner.state[p]
            # Where torch's _init_group puts it: on the device for capturable/fused, else a CPU scalar.
            state.setdefault(
                "step",
                torch.zeros((), dtype=torch.float32, device=p.device) if on_device else torch.tensor(0.0, dtype=scalar),
            )
            if group.get("amsgrad"):
                state.setdefault("max_exp_avg_sq", torch.zeros_like(p, memory_format=torch.preserve_format))


class TrainerOffload:
    """Moves what the engines allocate inside region() off the GPU and back; does nothing without CUDA."""

    def __init__(self, requested: bool, tag: str = TAG, rebuild_groups: bool = False) -> None:
        self.enabled = bool(requested) and torch.cuda.is_available()
        self.tag = tag
        # NCCL only: with another backend the communicators hold no GPU memory worth a rebuild.
        self.rebuild_groups = (
            self.enabled and rebuild_groups and dist.is_initialized() and dist.get_backend() == dist.Backend.NCCL
        )
        self.offloaded = False
        self._saver = _memory_saver() if self.enabled else None
        if requested and not self.enabled:
            logger.info("--offload-train: no CUDA here, nothing to offload (torch_memory_saver is CUDA-only)")

    @contextmanager
    def region(self) -> Iterator[None]:
        """Build the engines (model, gradient buffers, optimizer) inside: what offload() moves."""
        if not self.enabled:
            yield
            return
        if self.offloaded:
            raise RuntimeError("TrainerOffload.region() while offloaded: call onload() first")
        with self._saver.region(tag=self.tag, enable_cpu_backup=True):
            yield

    def offload(self) -> dict[str, float]:
        """Pause the region's memory (a no-op if already offloaded); returns the accounting in GiB."""
        if not self.enabled or self.offloaded:
            return {}
        start = time.monotonic()
        before = memory_snapshot()
        torch.cuda.synchronize()  # no kernel may still read the pages about to be unmapped
        gc.collect()
        torch.cuda.empty_cache()  # the last phase's activations and temporaries (outside the region)
        self._saver.pause(self.tag)
        if self.rebuild_groups:
            destroy_reloadable_groups()
        self.offloaded = True
        return self._account("offload", before, memory_snapshot(), time.monotonic() - start)

    def onload(self) -> dict[str, float]:
        """Map the region's memory again with its contents (a no-op if not offloaded); returns the accounting."""
        if not self.enabled or not self.offloaded:
            return {}
        start = time.monotonic()
        before = memory_snapshot()
        self._saver.resume(self.tag)
        if self.rebuild_groups:
            reload_reloadable_groups()
        torch.cuda.synchronize()
        self.offloaded = False
        return self._account("onload", before, memory_snapshot(), time.monotonic() - start)

    @staticmethod
    def _account(phase: str, before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
        moved = after["free"] - before["free"] if phase == "offload" else before["free"] - after["free"]
        logger.info(
            "trainer %s in %.2f s: GPU free %.2f -> %.2f of %.2f GiB (%.2f GiB %s); torch allocated %.2f -> %.2f GiB",
            phase,
            seconds,
            before["free"],
            after["free"],
            after["total"],
            moved,
            "freed" if phase == "offload" else "taken back",
            before["allocated"],
            after["allocated"],
        )
        return {
            f"memory/{phase}_free_gib_before": before["free"],
            f"memory/{phase}_free_gib_after": after["free"],
            f"memory/{phase}_moved_gib": moved,
            f"memory/{phase}_allocated_gib_before": before["allocated"],
            f"memory/{phase}_allocated_gib_after": after["allocated"],
            "memory/total_gib": after["total"],
            f"time/train_{phase}": seconds,
        }
