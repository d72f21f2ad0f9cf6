"""LoRA transport: the adapter, not the model. Each update swaps the new adapter version into every server under
one name (rollout.sglang_client.LORA_ADAPTER_NAME), which every rollout request names. Two media:
- "tensor" (every server on this machine): the adapter is copied into one of two alternating shared-memory
  buffers and the servers load it from its handles (SGLang's flattened-bucket format, as the tensor transport
  sends full weights); nothing touches the disk. Two buffers: the adapter the servers hold may keep views of its
  buffer until it is unloaded, which happens in the next update.
- "disk" (a server on another node): each update writes `<dir>/v<version>/` in HF PEFT format and the servers
  load it by path; the directory must be on a filesystem they share (as for the disk transport).

An update is one request per server: rollout/sglang_launch.py's swap endpoint pauses generation, unloads the old
adapter, loads the new one, tags the weight version and continues, inside the server. A server started another way
(no such endpoint) gets the same steps as five requests (base.py's protocol around `send`). Either way generation is
paused and drained while the adapter is swapped, so no request holds the old adapter while it is unloaded, and
requests that arrive meanwhile wait in SGLang until generation continues, then resolve the name to the new adapter.
The KV caches are not flushed: SGLang keys its prefix cache by adapter id and every load gets a new id.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import torch
import torch.multiprocessing

from rollout import sglang_client as client
from slime_like.core.errors import EngineError
from slime_like.trainer.megatron.lora import LoraSettings, adapter_config, write_adapter
from slime_like.trainer.megatron.lora_slots import SEPARATOR
from slime_like.trainer.weights.base import NamedTensors, WeightTransport, phase
from slime_like.trainer.weights.tensor import serialize_bucket

logger = logging.getLogger(__name__)
MEDIA = ("auto", "tensor", "disk")
_ALIGN = 64  # every tensor starts on a cache line of the shared buffer
# Shared buffers let go of, never freed while the trainer runs: when a server that had opened one dies, torch's
# shared-memory manager unlinks its file, and freeing it then aborts the trainer (SIGABRT in the allocator, seen in
# tests/integration/test_update_faults.py[lora]). Two adapter copies per transport closed or per engine lost.
_RETIRED: list[torch.Tensor] = []


def on_this_machine(url: str) -> bool:
    """Whether the server at `url` runs on this machine: its host is one of this machine's addresses."""
    host = urlsplit(url).hostname or ""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            sock.bind((host, 0))  # binding succeeds only for a local address
    except OSError:
        return False
    return True


@contextlib.contextmanager
def file_system_sharing() -> Iterator[None]:
    """torch's "file_system" sharing strategy inside: CPU tensors pickle as shared-memory file names that a server
    opens (with the default strategy the server's scheduler dies with an AuthenticationError)."""
    before = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy("file_system")
    try:
        yield
    finally:
        torch.multiprocessing.set_sharing_strategy(before)


def _file_exists(buffer: torch.Tensor) -> bool:
    """Whether the shared-memory file behind a buffer shared with the "file_system" strategy still exists."""
    _, handle, _ = buffer.untyped_storage()._share_filename_cpu_()
    name = handle.decode() if isinstance(handle, bytes) else str(handle)
    return os.path.exists("/dev/shm/" + name.lstrip("/"))


# PEFT's separate modules that SGLang stacks into one (its LoRA layers' names), in stacking order.
STACKS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
_STACK_OF = {module: stack for stack, modules in STACKS.items() for module in modules}


def stacked(tensors: dict[str, torch.Tensor]) -> list[tuple[str, list[torch.Tensor]]]:
    """PEFT-keyed adapter tensors in SGLang's stacked layout: (key, parts laid end to end along dim 0).

    Megatron's fused linear_qkv and linear_fc1 hold one A, which PEFT's format repeats for q, k and v (gate and up).
    SGLang stacks them again when it loads (A: [3r, in] from three equal copies, B: [q+k+v, r]), and takes a module
    already stacked under its own name (`qkv_proj`, `gate_up_proj`): A once, which it repeats, and B whole. So each
    group whose A's are one tensor (the same values) goes as `<layer>.qkv_proj.lora_A` (A once) and `lora_B` (the
    B's end to end): fewer bytes and tensors, and no concatenation in the server. Anything else goes as it is.
    """
    groups: dict[tuple[str, str], dict[str, dict[str, torch.Tensor]]] = {}
    for key, tensor in tensors.items():
        prefix, module, kind, _ = key.rsplit(".", 3)  # "<layer>.self_attn", "q_proj", "lora_A", "weight"
        if module in _STACK_OF:
            groups.setdefault((prefix, _STACK_OF[module]), {}).setdefault(module, {})[kind] = tensor
    out: list[tuple[str, list[torch.Tensor]]] = []
    done: set[tuple[str, str]] = set()
    for key, tensor in tensors.items():
        prefix, module, kind, _ = key.rsplit(".", 3)
        group = (prefix, _STACK_OF.get(module, ""))
        parts = groups.get(group)
        if parts is None or not _stackable(parts, STACKS[group[1]]):
            out.append((key, [tensor]))
        elif group not in done:
            done.add(group)
            modules = STACKS[group[1]]
            out.append((f"{prefix}.{group[1]}.lora_A.weight", [parts[modules[0]]["lora_A"]]))
            out.append((f"{prefix}.{group[1]}.lora_B.weight", [parts[m]["lora_B"] for m in modules]))
    return out


def _stackable(parts: dict[str, dict[str, torch.Tensor]], modules: tuple[str, ...]) -> bool:
    """Whether a group holds every module's A and B, with one A (the same values) for all."""
    if set(parts) != set(modules) or any(set(p) != {"lora_A", "lora_B"} for p in parts.values()):
        return False
    first = parts[modules[0]]["lora_A"]
    return all(
        a is first or (a.shape == first.shape and torch.equal(a, first))
        for a in (parts[m]["lora_A"] for m in modules[1:])
    )


def flatten_stacked(
    entries: list[tuple[str, list[torch.Tensor]]], buffer: torch.Tensor
) -> tuple[torch.Tensor, list[dict]]:
    """Copy each entry's parts end to end into `buffer` (uint8), each entry starting on a cache line; return the used
    part and each entry's place, as base.flatten_into does for single tensors."""
    metadata = []
    offset = 0
    # On CPU the trainer runs under a TorchFunctionMode (megatron/cpu_compat.py) that costs ~5 us per torch call:
    # over an adapter's ~100 small tensors that was 2/3 of the copy's time.
    with torch._C.DisableTorchFunction():
        for name, parts in entries:
            offset = -(-offset // _ALIGN) * _ALIGN
            start = offset
            for part in parts:
                nbytes = part.numel() * part.element_size()
                buffer[offset : offset + nbytes].view(part.dtype).view(part.shape).copy_(part)
                offset += nbytes
            shape = torch.Size([sum(p.shape[0] for p in parts), *parts[0].shape[1:]])
            metadata.append(
                {
                    "name": name,
                    "shape": shape,
                    "dtype": parts[0].dtype,
                    "start_idx": start,
                    "end_idx": offset,
                    "numel": offset - start,
                }  # fmt: skip
            )
    return buffer[:offset], metadata


class LoraTransport(WeightTransport):
    """Swaps each new adapter version into every server (unloading the one before), from shared memory or disk."""

    name = "lora"

    def __init__(
        self,
        server_urls: list[str],
        settings: LoraSettings,
        base_model: str,
        directory: str | Path,
        adapter_name: str = client.LORA_ADAPTER_NAME,
        timeout_s: float = 300.0,
        medium: str = "auto",
    ) -> None:
        super().__init__(server_urls, bucket_bytes=0, timeout_s=timeout_s)
        if medium not in MEDIA:
            raise ValueError(f"LoRA update medium {medium!r}: choose one of {', '.join(MEDIA)}")
        if medium == "auto":
            medium = "tensor" if all(on_this_machine(url) for url in server_urls) else "disk"
        self.medium = medium
        self.settings = settings
        self.base_model = base_model
        self.directory = Path(directory)
        self.adapter_name = adapter_name
        self.bytes_sent = 0  # the adapter's size at the last update
        self.timings: dict[str, float] = {}  # the last update's seconds: prepare (export, copy or write), requests
        self.server_timings: dict[str, dict[str, float]] = {}  # url -> seconds per step of its last swap
        self.one_request = True  # False: every update as separate requests (as for servers without the endpoint)
        self._held: set[tuple[str, str]] = set()  # (server, adapter name) this transport loaded
        self._no_swap: set[str] = set()  # servers without the one-request swap (not started by rollout.sglang_launch)
        self._servers: dict[str, client.KeptAlive] = {}  # a kept connection to each server for its swaps
        self._buffers: list[torch.Tensor] = []
        self._updates = 0

    # No cache flush: SGLang keys its prefix cache by adapter id (the request's lora_id joins its cache key) and
    # every load gets a new id, so no entry cached under the old adapter can be reused; the base never changes.
    flush_cache = False

    def update(self, named_tensors: NamedTensors, version: int, pause_mode: str = "abort") -> None:
        """Swap version `version` in on every server: one request each (pause, unload, load, tag, continue); servers
        without that endpoint (or all, with one_request False) get the steps as separate requests."""
        start = time.perf_counter()
        phase("start", self.server_urls, version)
        adapters = self._adapters(named_tensors, version)
        prepared = time.perf_counter()
        with self._explained():
            swapped = [url for url in self.server_urls if url not in self._no_swap] if self.one_request else []
            answers = client.on_all(swapped, self._swap, adapters, version, pause_mode)
            for url, timings in zip(swapped, answers, strict=True):
                if timings is None:
                    self._no_swap.add(url)
                    logger.info("%s has no %s: LoRA updates go as separate requests", url, client.LORA_SWAP_PATH)
                else:
                    self.server_timings[url] = timings
            rest = [url for url in self.server_urls if url not in swapped]
            if rest:
                self.around(rest, lambda: client.on_all(rest, self._load, adapters), version, pause_mode)
        phase("sent", self.server_urls, version)
        self.timings = {"prepare": prepared - start, "requests": time.perf_counter() - prepared}

    def send(self, named_tensors: NamedTensors, version: int) -> None:
        """Swap version `version` in on every server, as separate unload and load requests (no pause, no tag)."""
        adapters = self._adapters(named_tensors, version)
        with self._explained():
            client.on_all(self.server_urls, self._load, adapters)

    def _adapters(self, named_tensors: NamedTensors, version: int) -> list[dict]:
        """What the servers load: this adapter's source (LoRA_SWAP_PATH's format), and its size in bytes_sent."""
        return [self._adapter(dict(named_tensors), version)]

    def _adapter(self, tensors: dict[str, torch.Tensor], version: int) -> dict:
        """One adapter's source: handles of its copy in the next shared buffer, or its PEFT directory."""
        if self.medium == "tensor":
            config, serialized = self._share(tensors)
            return {
                "lora_name": self.adapter_name,
                "config_dict": config,
                "serialized_tensors": serialized,
                "load_format": "flattened_bucket",
            }
        for old in self.directory.glob("v*"):  # keep the version the servers hold (the last one) and the new one
            if old.name not in (f"v{version - 1}", f"v{version}"):
                shutil.rmtree(old, ignore_errors=True)
        target = self.directory / f"v{version}"
        shutil.rmtree(target, ignore_errors=True)
        write_adapter(target, tensors, self.settings, self.base_model)
        self.bytes_sent = sum(p.stat().st_size for p in target.iterdir())
        return {"lora_name": self.adapter_name, "lora_path": str(target)}

    def _share(self, tensors: dict[str, torch.Tensor]) -> tuple[dict, str]:
        """The adapter's config and its tensors in SGLang's stacked layout (`stacked`) copied into the next shared
        buffer, serialized as handles."""
        slot = self._updates % 2
        self._updates += 1
        with file_system_sharing(), torch._C.DisableTorchFunction():  # as in flatten_stacked
            entries = stacked(tensors)
            nbytes = sum(-(-sum(p.numel() * p.element_size() for p in ps) // _ALIGN) * _ALIGN for _, ps in entries)
            if len(self._buffers) <= slot:
                self._buffers.append(torch.empty(0, dtype=torch.uint8))
            buffer = self._buffers[slot]
            # Made once (a new shared file costs more than the copy), and again when its file is gone: torch's
            # shared-memory manager unlinks every file a server had opened when that server dies.
            if buffer.numel() < nbytes or not _file_exists(buffer):
                if buffer.numel():
                    _RETIRED.append(buffer)  # freeing one whose file is gone aborts this process
                self._buffers[slot] = torch.empty(nbytes, dtype=torch.uint8).share_memory_()
            flat, metadata = flatten_stacked(entries, self._buffers[slot])
            serialized = serialize_bucket(flat, metadata)
        self.bytes_sent = flat.numel()
        modules = sorted({name.split(".")[-3] for name, _ in entries})  # "...self_attn.qkv_proj.lora_A.weight"
        return adapter_config(self.settings, self.base_model, modules), serialized

    def _swap(self, url: str, adapters: list[dict], version: int, pause_mode: str) -> dict[str, float] | None:
        """The whole update on one server in one request; None when it has no such endpoint."""
        server = self._servers.get(url) or self._servers.setdefault(url, client.KeptAlive(url))
        timings = client.swap_lora_adapters(server, adapters, version, pause_mode, self.timeout_s)
        if timings is not None:
            self._held.update((url, adapter["lora_name"]) for adapter in adapters)
        return timings

    def _load(self, url: str, adapters: list[dict]) -> None:
        """Unload each adapter's name on the server (asking first unless this transport loaded it), load the new."""
        for adapter in adapters:
            name = adapter["lora_name"]
            client.unload_lora_adapter(url, name, self.timeout_s, held=(url, name) in self._held)
            self._held.discard((url, name))
            if "lora_path" in adapter:
                client.load_lora_adapter(url, name, adapter["lora_path"], self.timeout_s)
            else:
                client.load_lora_adapter_from_tensors(
                    url, name, adapter["config_dict"], adapter["serialized_tensors"], self.timeout_s
                )
            self._held.add((url, name))

    def close(self) -> None:
        """Close the kept connections and let go of the shared buffers (kept for the process's life: see _RETIRED)."""
        for server in self._servers.values():
            server.close()
        self._servers.clear()
        _RETIRED.extend(self._buffers)
        self._buffers.clear()

    @contextlib.contextmanager
    def _explained(self) -> Iterator[None]:
        """A server's error, with what it means when the adapter went through shared memory."""
        try:
            yield
        except EngineError as exc:
            if self.medium != "tensor":
                raise
            raise EngineError(
                f"{exc}\n(the servers run on this machine, so the adapter went through shared memory, /dev/shm: a "
                "server that cannot open it, e.g. one in a container with its own /dev/shm, needs "
                "LoraTransport(medium='disk'))"
            ) from exc


class MultiLoraTransport(LoraTransport):
    """Multi-LoRA: each update loads every adapter it carries (keys `<name>/<PEFT key>`) under its own name (on
    disk from `<dir>/<name>/v<version>/`), in one pause of generation; adapters it does not carry keep their
    version."""

    name = "lora"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._adapters_by_name: dict[str, LoraTransport] = {}  # one per adapter name, with its own buffers

    def close(self) -> None:
        """Close the kept connections and free every adapter's shared buffers."""
        super().close()
        for one in self._adapters_by_name.values():
            one.close()

    def _adapters(self, named_tensors: NamedTensors, version: int) -> list[dict]:
        """Each adapter the update carries, through its own buffers (or directory `<dir>/<name>/`)."""
        adapters: dict[str, dict] = {}
        for key, tensor in named_tensors:
            name, _, peft_key = key.partition(SEPARATOR)
            adapters.setdefault(name, {})[peft_key] = tensor
        sources, sent = [], 0
        for name, tensors in adapters.items():
            one = self._adapters_by_name.get(name)
            if one is None:
                one = self._adapters_by_name[name] = LoraTransport(
                    self.server_urls, self.settings, self.base_model, self.directory / name, name, self.timeout_s,
                    self.medium,
                )  # fmt: skip
            sources.append(one._adapter(tensors, version))
            sent += one.bytes_sent
        self.bytes_sent = sent
        return sources
