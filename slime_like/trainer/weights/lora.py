"""LoRA transport: the adapter, not the model. Each update swaps the new adapter version into every server under
one name (rollout.sglang_client.LORA_ADAPTER_NAME), which every rollout request names. Two media:
- "tensor" (every server on this machine): the adapter is copied into one of two alternating shared-memory
  buffers and the servers load it from its handles (/load_lora_adapter_from_tensors, SGLang's flattened-bucket
  format, as the tensor transport sends full weights); nothing touches the disk. Two buffers: the adapter the
  servers hold may keep views of its buffer until it is unloaded, which happens in the next update.
- "disk" (a server on another node): each update writes `<dir>/v<version>/` in HF PEFT format and the servers
  load it by path; the directory must be on a filesystem they share (as for the disk transport).

The swap runs inside the update protocol (base.py): generation is paused and drained, so no request holds the
old adapter while it is unloaded, and requests that arrive meanwhile wait in SGLang until generation continues,
then resolve the name to the new adapter.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import torch
import torch.multiprocessing

from rollout import sglang_client as client
from slime_like.core.errors import EngineError
from slime_like.trainer.megatron.lora import LoraSettings, adapter_config, write_adapter
from slime_like.trainer.megatron.lora_slots import SEPARATOR
from slime_like.trainer.weights.base import NamedTensors, WeightTransport, flat_size, flatten_into
from slime_like.trainer.weights.tensor import serialize_bucket

logger = logging.getLogger(__name__)
MEDIA = ("auto", "tensor", "disk")
_ALIGN = 64  # every tensor starts on a cache line of the shared buffer


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
        self._held: set[str] = set()  # servers that hold the adapter because this transport loaded it
        self._buffers: list[torch.Tensor] = []
        self._updates = 0

    # No cache flush: SGLang keys its prefix cache by adapter id (the request's lora_id joins its cache key) and
    # every load gets a new id, so no entry cached under the old adapter can be reused; the base never changes.
    flush_cache = False

    def send(self, named_tensors: NamedTensors, version: int) -> None:
        """Swap version `version` of the adapter in on every server."""
        tensors = dict(named_tensors)
        if self.medium == "tensor":
            config, serialized = self._share(tensors)
            try:
                client.on_all(self.server_urls, self._swap, client.load_lora_adapter_from_tensors, config, serialized)
            except EngineError as exc:
                raise EngineError(
                    f"{exc}\n(the servers run on this machine, so the adapter went through shared memory, "
                    "/dev/shm: a server that cannot open it, e.g. one in a container with its own /dev/shm, needs "
                    "LoraTransport(medium='disk'))"
                ) from exc
            return
        target = self.directory / f"v{version}"
        shutil.rmtree(target, ignore_errors=True)
        write_adapter(target, tensors, self.settings, self.base_model)
        self.bytes_sent = sum(p.stat().st_size for p in target.iterdir())
        client.on_all(self.server_urls, self._swap, client.load_lora_adapter, str(target))
        for old in self.directory.glob("v*"):
            if old != target and old.name != f"v{version - 1}":
                shutil.rmtree(old, ignore_errors=True)

    def _share(self, tensors: dict[str, torch.Tensor]) -> tuple[dict, str]:
        """The adapter's PEFT config and its tensors copied into the next shared buffer, serialized as handles."""
        bucket = list(tensors.items())
        nbytes = flat_size(bucket, _ALIGN)
        slot = self._updates % 2
        self._updates += 1
        with file_system_sharing():
            if len(self._buffers) <= slot:
                self._buffers.append(torch.empty(0, dtype=torch.uint8))
            if self._buffers[slot].numel() < nbytes:  # made once: a new shared file costs more than the copy
                self._buffers[slot] = torch.empty(nbytes, dtype=torch.uint8).share_memory_()
            flat, metadata = flatten_into(bucket, self._buffers[slot], _ALIGN)
            serialized = serialize_bucket(flat, metadata)
        self.bytes_sent = nbytes
        modules = sorted({key.split(".")[-3] for key in tensors})  # "...self_attn.q_proj.lora_A.weight" -> q_proj
        return adapter_config(self.settings, self.base_model, modules), serialized

    def _swap(self, url: str, load, *source) -> None:
        """Unload the server's adapter of this name (asking first unless this transport loaded it), load the new."""
        client.unload_lora_adapter(url, self.adapter_name, self.timeout_s, held=url in self._held)
        self._held.discard(url)
        load(url, self.adapter_name, *source, self.timeout_s)
        self._held.add(url)


class MultiLoraTransport(LoraTransport):
    """Multi-LoRA: each update loads every adapter it carries (keys `<name>/<PEFT key>`) under its own name (on
    disk from `<dir>/<name>/v<version>/`), in one pause of generation; adapters it does not carry keep their
    version."""

    name = "lora"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._adapters: dict[str, LoraTransport] = {}  # one per adapter name, each with its own buffers

    def send(self, named_tensors: NamedTensors, version: int) -> None:
        """Swap in each adapter the update carries."""
        adapters: dict[str, dict] = {}
        for key, tensor in named_tensors:
            name, _, peft_key = key.partition(SEPARATOR)
            adapters.setdefault(name, {})[peft_key] = tensor
        sent = 0
        for name, tensors in adapters.items():
            one = self._adapters.get(name)
            if one is None:
                one = self._adapters[name] = LoraTransport(
                    self.server_urls, self.settings, self.base_model, self.directory / name, name, self.timeout_s,
                    self.medium,
                )  # fmt: skip
            one.send(tensors.items(), version)
            sent += one.bytes_sent
        self.bytes_sent = sent
