"""Disk transport: write HF safetensors, then each server reloads them with /update_weights_from_disk."""

from __future__ import annotations

import shutil
from pathlib import Path

from safetensors.torch import save_file

from rollout import sglang_client as client
from slime_like.trainer.weights.base import NamedTensors, WeightTransport, buckets

# Weight files of the HF checkpoint (the update writes its own); every other file there (config, tokenizer files,
# custom code such as Kimi-K2's configuration_deepseek.py named by config.json's auto_map) is copied alongside.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def _model_files(hf_checkpoint: Path) -> list[Path]:
    """The files of an HF checkpoint directory a server needs besides the weights."""
    return [
        p
        for p in sorted(hf_checkpoint.iterdir())
        if p.is_file() and not p.name.endswith(_WEIGHT_SUFFIXES) and p.name not in _WEIGHT_INDEXES
    ]


class DiskTransport(WeightTransport):
    """Writes `<dir>/v<version>/` (config and tokenizer copied from the HF checkpoint), keeping the last two (all of
    them with keep_files, --update-weight-disk-keep-files)."""

    name = "disk"

    def __init__(
        self,
        server_urls: list[str],
        bucket_bytes: int,
        hf_checkpoint: str,
        directory: str,
        timeout_s: float = 600.0,
        keep_files: bool = False,
    ) -> None:
        super().__init__(server_urls, bucket_bytes, timeout_s)
        self.keep_files = keep_files
        self.hf_checkpoint = Path(hf_checkpoint)
        self.directory = Path(directory)

    def send(self, named_tensors: NamedTensors, version: int) -> None:
        """Write the shards, then reload them on every server."""
        target = self.write(named_tensors, version)
        client.on_all(self.server_urls, client.update_weights_from_disk, str(target), version, self.timeout_s)
        for old in [] if self.keep_files else self.directory.glob("v*"):
            if old != target and old.name != f"v{version - 1}":
                shutil.rmtree(old, ignore_errors=True)

    def write(self, named_tensors: NamedTensors, version: int) -> Path:
        """An HF checkpoint directory holding these tensors (one safetensors shard per bucket)."""
        return write_checkpoint(named_tensors, self.directory / f"v{version}", self.hf_checkpoint, self.bucket_bytes)


def write_checkpoint(named_tensors: NamedTensors, target: Path, hf_checkpoint: Path, bucket_bytes: int) -> Path:
    """`target` as an HF checkpoint of these tensors (one safetensors shard per bucket, the other files of
    `hf_checkpoint` copied); returns it."""
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for path in _model_files(Path(hf_checkpoint)):
        shutil.copy(path, target / path.name)
    for i, bucket in enumerate(buckets(named_tensors, bucket_bytes)):
        save_file({n: t.detach().contiguous().cpu() for n, t in bucket}, target / f"model-{i:05d}.safetensors")
    return target
