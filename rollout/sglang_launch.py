"""`python -m rollout.sglang_launch ARGS`: SGLang's launch_server, able to return routed experts (R3) and serve LoRA
adapters on CPU.

SGLang 0.5.15 keeps the routed experts it captures (--enable-return-routed-experts) in a host buffer allocated
with pin_memory=True (sglang/srt/state_capturer/base.py, BaseHostCache), which a CPU-only torch refuses at start:
"RuntimeError: pin_memory=True requires a CUDA or other accelerator backend; no pinned memory allocator is available
on this system." Pinning only speeds up device-to-host copies, which a CPU engine does not make, so without an
accelerator the buffer is allocated unpinned; everything else (capture, per-request gather, base64 in meta_info)
is SGLang's own code. LoRA serving (--enable-lora) stops at the same error: SGLang's LoRA manager pins its
per-batch index tensors and adapter weights (sglang/srt/lora/layers.py, lora.py, backend/torch_backend.py, with
`pin_memory=True` and `.pin_memory()`), so every LoRAManager method runs with pinning turned into a plain copy.

Second, SGLang's overlap scheduler hands each step's captured experts on as a "device-to-host copy" made with
`tensor.to("cpu")` (managers/utils.py, _async_d2h), which on CPU is the capture buffer itself, not a copy: the
next step overwrites it before it is stored, and the experts returned for a token are another step's (measured on
the tiny Qwen3-MoE: the returned rows agreed with the experts actually used for 25% of token-layers, and mostly
with the next token's). So without an accelerator the server runs with --disable-overlap-schedule.

The change is an AROUND hook in SGLang's plugin registry (sglang.srt.plugins.hook_registry), which SGLang applies
in every one of its processes (load_plugins). It is registered when this module is imported, and every SGLang
process imports it: SGLang starts its scheduler and detokenizer with multiprocessing's spawn, which imports the
parent's main module, this one, in each child before running it.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

HOST_CACHE_INIT = "sglang.srt.state_capturer.base.BaseHostCache.__init__"


LORA_MANAGER = "sglang.srt.lora.lora_manager.LoRAManager"
# Every LoRAManager method that builds layers, loads or unloads adapters or prepares a batch (all of them pin).
LORA_METHODS = (
    "__init__",
    "load_lora_adapter",
    "load_lora_adapter_from_tensors",
    "unload_lora_adapter",
    "prepare_lora_batch",
    "update_lora_info",
)


class _Unpinned(TorchFunctionMode):
    """Tensor factories called inside it allocate unpinned memory; `Tensor.pin_memory()` returns a plain copy."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.pin_memory:
            return args[0].clone()  # pinning copies; callers may rely on getting a tensor of their own
        kwargs = dict(kwargs or {})
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        return func(*args, **kwargs)


def unpinned_host_cache(original: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND hook of BaseHostCache.__init__ and the LoRAManager methods: nothing pinned (no accelerator, no pinned
    allocator)."""
    with _Unpinned():
        return original(*args, **kwargs)


def register_cpu_hooks() -> None:
    """Register the hooks with SGLang's plugin registry when torch has no accelerator (it pins fine elsewhere)."""
    if torch.cuda.is_available():
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(HOST_CACHE_INIT, unpinned_host_cache, HookType.AROUND)
    for method in LORA_METHODS:
        HookRegistry.register(f"{LORA_MANAGER}.{method}", unpinned_host_cache, HookType.AROUND)


register_cpu_hooks()  # at import: in this process and in every spawned SGLang child (see the module docstring)


NO_OVERLAP = "--disable-overlap-schedule"


def main(argv: list[str]) -> None:
    """What `python -m sglang.launch_server` does, with this module as the main one (no overlap scheduler on CPU)."""
    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    load_plugins()  # applies the registered hooks
    try:
        run_server(
            prepare_server_args(argv + ([] if torch.cuda.is_available() or NO_OVERLAP in argv else [NO_OVERLAP]))
        )
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main(sys.argv[1:])
