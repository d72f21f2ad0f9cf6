"""LoRA transport: the adapter, not the model. Each update writes `<dir>/v<version>/` in HF PEFT format and every
server swaps it in under one name (rollout.sglang_client.LORA_ADAPTER_NAME), which every rollout request names.

The swap runs inside the update protocol (base.py): generation is paused and drained, so no request holds the
old adapter while it is unloaded, and requests that arrive meanwhile wait in SGLang until generation continues,
then resolve the name to the new adapter. The servers read the directory: on several nodes it must be on a
filesystem they share (as for the disk transport).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rollout import sglang_client as client
from slime_like.trainer.megatron.lora import LoraSettings, write_adapter
from slime_like.trainer.megatron.lora_slots import SEPARATOR
from slime_like.trainer.weights.base import NamedTensors, WeightTransport


class LoraTransport(WeightTransport):
    """Loads each new adapter version into every server (unloading the one before); keeps the last two on disk."""

    name = "lora"

    def __init__(
        self,
        server_urls: list[str],
        settings: LoraSettings,
        base_model: str,
        directory: str | Path,
        adapter_name: str = client.LORA_ADAPTER_NAME,
        timeout_s: float = 300.0,
    ) -> None:
        super().__init__(server_urls, bucket_bytes=0, timeout_s=timeout_s)
        self.settings = settings
        self.base_model = base_model
        self.directory = Path(directory)
        self.adapter_name = adapter_name
        self.bytes_sent = 0  # the adapter's size at the last update

    def send(self, named_tensors: NamedTensors, version: int) -> None:
        """Write the adapter as version `version`, then swap it in on every server."""
        target = self.directory / f"v{version}"
        shutil.rmtree(target, ignore_errors=True)
        write_adapter(target, dict(named_tensors), self.settings, self.base_model)
        self.bytes_sent = sum(p.stat().st_size for p in target.iterdir())
        client.on_all(self.server_urls, self._swap, str(target))
        for old in self.directory.glob("v*"):
            if old != target and old.name != f"v{version - 1}":
                shutil.rmtree(old, ignore_errors=True)

    def _swap(self, url: str, path: str) -> None:
        client.unload_lora_adapter(url, self.adapter_name, self.timeout_s)
        client.load_lora_adapter(url, self.adapter_name, path, self.timeout_s)


class MultiLoraTransport(LoraTransport):
    """Multi-LoRA: each update loads every adapter it carries (keys `<name>/<PEFT key>`) under its own name, from
    `<dir>/<name>/v<version>/`, in one pause of generation; adapters it does not carry keep their version."""

    name = "lora"

    def send(self, named_tensors: NamedTensors, version: int) -> None:
        """Write and swap in each adapter the update carries."""
        adapters: dict[str, dict] = {}
        for key, tensor in named_tensors:
            name, _, peft_key = key.partition(SEPARATOR)
            adapters.setdefault(name, {})[peft_key] = tensor
        sent = 0
        for name, tensors in adapters.items():
            one = LoraTransport(
                self.server_urls, self.settings, self.base_model, self.directory / name, name, self.timeout_s
            )
            one.send(tensors.items(), version)
            sent += one.bytes_sent
        self.bytes_sent = sent
