"""`python -m rollout.sglang_launch ARGS`: SGLang's launch_server, able to return routed experts (R3) and serve LoRA
adapters on CPU, and with one more endpoint that swaps LoRA adapters in one request (on every device).

SGLang 0.5.15 keeps the routed experts it captures (--enable-return-routed-experts) in a host buffer allocated
with pin_memory=True (sglang/srt/state_capturer/base.py, BaseHostCache), which a CPU-only torch refuses at start:
"RuntimeError: pin_memory=True requires a CUDA or other accelerator backend; no pinned memory allocator is available
on this system." Pinning only speeds up device-to-host copies, which a CPU engine does not make, so without an
accelerator the buffer is allocated unpinned; everything else (capture, per-request gather, base64 in meta_info)
is SGLang's own code. LoRA serving (--enable-lora) stops at the same error: SGLang's LoRA manager pins its
per-batch index tensors and adapter weights (sglang/srt/lora/layers.py, lora.py, backend/torch_backend.py, with
`pin_memory=True` and `.pin_memory()`), so the LoRAManager methods that pin (building the layers, preparing a batch)
run with pinning turned into a plain copy. Loading and unloading an adapter pin nothing on CPU (SGLang's
is_pin_memory_available() is False there) and run unhooked: the hook's per-op dispatch took a third of a load's
time in the scheduler (sampled with py-spy).

Second, SGLang's overlap scheduler hands each step's captured experts on as a "device-to-host copy" made with
`tensor.to("cpu")` (managers/utils.py, _async_d2h), which on CPU is the capture buffer itself, not a copy: the
next step overwrites it before it is stored, and the experts returned for a token are another step's (measured on
the tiny Qwen3-MoE: the returned rows agreed with the experts actually used for 25% of token-layers, and mostly
with the next token's). So without an accelerator the server runs with --disable-overlap-schedule.

Third, two costs of every LoRA update that SGLang recomputes although they cannot change while a server runs: its
memory probe (get_available_gpu_memory, logged before and after each unload and load by path) runs `lscpu` on CPU
for the NUMA layout, ~2.5 ms a call (the topology is read once here; the free memory is still read every time), and
each adapter load walks every module of the base model for its MoE layers (LoRAAdapter._build_moe_gated_map; cached
per base model).

Fourth, POST /slime_like/swap_lora_adapters (`add_lora_swap_route`) does in one request what a LoRA weight update did
in five (pause, unload, load, version tag, continue): see `swap_lora_adapters`.

Fifth, for vision-language checkpoints: ids with expanded image pads go in as sent, and without CUDA the Qwen-VL
multimodal processors import (rollout/sglang_vlm.py says why both are needed).

The first three and the fifth are hooks in SGLang's plugin registry (sglang.srt.plugins.hook_registry), which SGLang
applies in every one of its processes (load_plugins). They are registered when this module is imported, and every
SGLang process has them: on GPU SGLang starts its scheduler and detokenizer with multiprocessing's spawn, which
imports the parent's main module, this one, in each child before running it; on CPU they start by fork
(rollout/sglang_server.py, LAUNCH_FORKED_ON_CPU) with the hooks already in place. The route is added in `main`, in
the process that serves HTTP.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

HOST_CACHE_INIT = "sglang.srt.state_capturer.base.BaseHostCache.__init__"


LORA_MANAGER = "sglang.srt.lora.lora_manager.LoRAManager"
# The LoRAManager methods that pin host memory: building the LoRA layers and memory pool (__init__ and the
# update_lora_info it calls) and the per-batch index tensors (prepare_lora_batch).
LORA_METHODS = ("__init__", "prepare_lora_batch", "update_lora_info")
LSCPU = "sglang.srt.utils.common.parse_lscpu_topology"
MOE_GATED_MAP = "sglang.srt.lora.lora.LoRAAdapter._build_moe_gated_map"
SWAP_ROUTE = "/slime_like/swap_lora_adapters"


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


_LSCPU: list[Any] = []  # the topology, once read


def lscpu_once(original: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND hook of parse_lscpu_topology: run `lscpu` once per process (the CPU topology does not change)."""
    if not _LSCPU:
        _LSCPU.append(original(*args, **kwargs))
    return list(_LSCPU[0])


_MOE_GATED: dict[int, Any] = {}  # id(base model) -> its MoE map (the base model lives as long as the server)


def moe_gated_map_once(original: Any, base_model: Any) -> Any:
    """AROUND hook of LoRAAdapter._build_moe_gated_map: walk the base model's modules once, not at every load."""
    key = id(base_model)
    if key not in _MOE_GATED:
        _MOE_GATED[key] = (base_model, original(base_model))  # holding the model keeps its id from being reused
    return dict(_MOE_GATED[key][1])


def register_hooks() -> None:
    """Register the hooks with SGLang's plugin registry: the caches everywhere, the unpinning and `lscpu` ones only
    when torch has no accelerator (it pins fine elsewhere, and the memory probe runs `lscpu` on CPU only)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from rollout.sglang_vlm import register_vlm_hooks

    HookRegistry.register(MOE_GATED_MAP, moe_gated_map_once, HookType.AROUND)
    register_vlm_hooks(torch.cuda.is_available())  # images with token-in; Qwen-VL processors on CPU (sglang_vlm.py)
    if torch.cuda.is_available():
        return
    HookRegistry.register(HOST_CACHE_INIT, unpinned_host_cache, HookType.AROUND)
    for method in LORA_METHODS:
        HookRegistry.register(f"{LORA_MANAGER}.{method}", unpinned_host_cache, HookType.AROUND)
    HookRegistry.register(LSCPU, lscpu_once, HookType.AROUND)


register_hooks()  # at import: in this process and in every spawned SGLang child (see the module docstring)


async def swap_lora_adapters(manager: Any, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """One LoRA weight update inside the server: pause generation (`pause_mode`, default abort), then for each of
    `adapters` unload the adapter of its name if the server holds one and load the new one (from shared-memory
    tensors: `config_dict`, `serialized_tensors`, `load_format`; or from a PEFT directory: `lora_path`), tag
    `weight_version`, and continue generation, also when a step failed (a paused server hangs every request).

    The same steps as the five requests it replaces (SGLang's own tokenizer-manager calls, in the same order), so
    the same guarantees: the pause aborts requests in flight (they return with the old version) and holds new ones
    until the continue, when they resolve the name to the new adapter. Returns the answer (success, message, and
    seconds per step in `timings`) and its HTTP status.
    """
    from sglang.srt.managers import io_struct as io

    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(step: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[step] = timings.get(step, 0.0) + now - clock
        clock = now

    error = None
    try:  # continued below also when the pause failed half-way
        await manager.pause_generation(io.PauseGenerationReqInput(mode=body.get("pause_mode", "abort")))
        lap("pause")
        held = manager.lora_registry.get_all_adapters()
        for adapter in body["adapters"]:
            name = adapter["lora_name"]
            if name in held:
                result = await manager.unload_lora_adapter(io.UnloadLoRAAdapterReqInput(lora_name=name))
                lap("unload")
                if not result.success:
                    error = f"unloading LoRA adapter {name!r}: {result.error_message}"
                    break
            if "lora_path" in adapter:
                request = io.LoadLoRAAdapterReqInput(lora_name=name, lora_path=adapter["lora_path"])
                result = await manager.load_lora_adapter(request)
            else:
                request = io.LoadLoRAAdapterFromTensorsReqInput(
                    lora_name=name,
                    config_dict=adapter["config_dict"],
                    serialized_tensors=adapter["serialized_tensors"],
                    load_format=adapter.get("load_format"),
                )
                result = await manager.load_lora_adapter_from_tensors(request)
            lap("load")
            if not result.success:
                error = f"loading LoRA adapter {name!r}: {result.error_message}"
                break
        else:
            if body.get("weight_version") is not None:  # as /update_weight_version does
                manager.server_args.weight_version = str(body["weight_version"])
    finally:
        await manager.continue_generation(io.ContinueGenerationReqInput())
        lap("continue")
    return {"success": error is None, "message": error, "timings": timings}, 200 if error is None else 400


def add_lora_swap_route() -> None:
    """Add POST SWAP_ROUTE (swap_lora_adapters) to SGLang's HTTP app, behind the same key as /unload_lora_adapter."""
    from fastapi import Request
    from fastapi.responses import ORJSONResponse
    from sglang.srt.entrypoints import http_server
    from sglang.srt.utils.auth import AuthLevel, auth_level

    async def swap(request):
        answer, status = await swap_lora_adapters(
            http_server.get_global_state().tokenizer_manager, await request.json()
        )
        return ORJSONResponse(answer, status_code=status)

    swap.__annotations__["request"] = Request  # a class, not a string: FastAPI passes the request by its type
    http_server.app.post(SWAP_ROUTE)(auth_level(AuthLevel.ADMIN_OPTIONAL)(swap))


NO_OVERLAP = "--disable-overlap-schedule"


def main(argv: list[str]) -> None:
    """What `python -m sglang.launch_server` does, with this module as the main one (no overlap scheduler on CPU)."""
    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    load_plugins()  # applies the registered hooks
    add_lora_swap_route()
    try:
        run_server(
            prepare_server_args(argv + ([] if torch.cuda.is_available() or NO_OVERLAP in argv else [NO_OVERLAP]))
        )
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main(sys.argv[1:])
