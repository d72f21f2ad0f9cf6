"""Delta weight sync (slime's `--update-weight-mode delta`): publish only the bytes that changed, on a shared disk.

The trainer keeps a CPU snapshot of every weight as the engines hold it, seeded from --hf-checkpoint (what each
engine host copies its local checkpoint from). Each update diffs the exported HF tensors against it and writes
`weight_v{N:06d}/` under --update-weight-disk-dir: an HF checkpoint directory of zstd-compressed per-tensor deltas
(safetensors, one uint8 tensor per changed weight, its checksum in the file's metadata) whose index json carries
the apply metadata (rollout/delta_format.py). The snapshot then advances. Every engine host applies the version to
its local checkpoint (--update-weight-local-checkpoint-dir; rollout/delta_pull.py) while generation goes on; then
generation pauses and each engine reloads the local checkpoint with /update_weights_from_disk (base.py's protocol).

In full mode (--update-weight-mode full with a local checkpoint dir) every version is a whole checkpoint, which the
hosts copy. A transport starts a new chain (a fresh id): its first call resets every host to its model path.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import save_file

from rollout import delta_format as fmt
from rollout import sglang_client as client
from rollout.delta_pull import pull_on_engine_hosts
from slime_like.core.errors import WeightUpdateError
from slime_like.trainer.weights.base import NamedTensors, WeightTransport
from slime_like.trainer.weights.disk import write_checkpoint

logger = logging.getLogger(__name__)

# safetensors' dtype names -> torch's: a delta is taken at the precision the checkpoint stores.
_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}  # fmt: skip
Puller = Callable[[int, str], list[dict[str, Any]]]  # (version, chain) -> each host's report


class DeltaDiskTransport(WeightTransport):
    """Publishes each version to a shared directory; every engine host pulls it into its local checkpoint, which the
    engine then reloads."""

    name = "disk"

    def __init__(
        self,
        server_urls: list[str],
        bucket_bytes: int,
        *,
        hf_checkpoint: str,
        disk_dir: str,
        local_dir: str,
        mode: str = "delta",
        encoding: str = "xor",
        checksum: str = "xxh3-128",
        pull: Puller | None = None,
        post_write: Callable[[str], None] | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        super().__init__(server_urls, bucket_bytes, timeout_s)
        self.hf_checkpoint, self.disk_dir, self.local_dir = Path(hf_checkpoint), Path(disk_dir), Path(local_dir)
        self.mode, self.encoding, self.checksum = mode, encoding, checksum
        self.pull = pull or (
            lambda v, c: pull_on_engine_hosts(str(self.local_dir), str(self.disk_dir), v, c, timeout_s)
        )
        self.post_write = post_write
        self.chain: str | None = None
        self.snapshot: dict[str, tuple[np.ndarray, torch.dtype, list[int]]] = {}  # name -> (bytes, dtype, shape)
        self.version = 0  # the snapshot's version: 0 is --hf-checkpoint
        self.stats: dict[str, float] = {}  # the last update's bytes and seconds

    def connect(self) -> None:
        """Start a chain: clear earlier versions, reset every host to its model path, seed the snapshot."""
        self.chain = uuid.uuid4().hex[:12]
        self.disk_dir.mkdir(parents=True, exist_ok=True)
        for old in self.disk_dir.glob("weight_v*"):  # another chain's versions would apply to the wrong base
            shutil.rmtree(old, ignore_errors=True)
        if self.mode == "delta":  # a full version replaces the local checkpoint: no base needed
            self.snapshot = _read_checkpoint(self.hf_checkpoint)
            self.pull(0, self.chain)

    def update(self, named_tensors: NamedTensors, version: int, pause_mode: str = "abort") -> None:
        """Publish, let every host apply it (generation goes on), then pause and reload (base.py's protocol)."""
        if self.chain is None:
            self.connect()
        start = time.monotonic()
        target = self.publish(named_tensors, version)
        published = time.monotonic()
        if self.post_write is not None:
            self.post_write(str(target))
        reports = self.pull(version, self.chain)
        pulled = time.monotonic()
        super().update((), version, pause_mode)
        self.stats.update(
            publish_s=published - start, pull_s=pulled - published, reload_s=time.monotonic() - pulled,
            hosts=len(reports), apply_s=max((r["seconds"] for r in reports), default=0.0),
        )  # fmt: skip

    def send(self, named_tensors: NamedTensors, version: int) -> None:
        """Reload every engine from its local checkpoint (already at `version`)."""
        client.on_all(self.server_urls, client.update_weights_from_disk, str(self.local_dir), version, self.timeout_s)

    def publish(self, named_tensors: NamedTensors, version: int) -> Path:
        """Write `weight_v{version:06d}/` (a delta against the snapshot, or a full checkpoint); returns it."""
        target = fmt.version_dir(self.disk_dir, version)
        if self.mode == "full":
            write_checkpoint(named_tensors, target, self.hf_checkpoint, self.bucket_bytes)
            for old in self.disk_dir.glob("weight_v*"):  # a full version needs no history
                if old != target:
                    shutil.rmtree(old, ignore_errors=True)
            self.stats = {"written_bytes": _dir_bytes(target)}
            return target
        return self._publish_delta(named_tensors, version, target)

    def _publish_delta(self, named_tensors: NamedTensors, version: int, target: Path) -> Path:
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        shard: dict[str, np.ndarray] = {}
        sums: dict[str, str] = {}
        weight_map: dict[str, str] = {}
        changed = total = pending = 0

        def flush() -> None:
            name = f"model-{len(set(weight_map.values())):05d}.safetensors"
            save_file(shard, str(target / name), metadata=sums)
            weight_map.update(dict.fromkeys(shard, name))
            shard.clear()
            sums.clear()

        for name, tensor in named_tensors:
            old, dtype, shape = self._base(name)
            value = tensor.detach().to("cpu", dtype).contiguous()
            if list(value.shape) != shape:
                raise WeightUpdateError(
                    f"{name} has shape {list(value.shape)} but {shape} in --hf-checkpoint {self.hf_checkpoint}: "
                    "delta weight sync needs the checkpoint the engines started from"
                )
            new = value.view(torch.uint8).numpy().reshape(-1)
            total += new.size
            blob = fmt.encode(new, old, self.encoding)
            if blob is None:
                continue
            changed += len(blob)
            shard[name] = np.frombuffer(blob, np.uint8)
            pending += len(blob)
            sums[name] = fmt.checksum(self.checksum, new)
            old[:] = new  # the snapshot advances: the next version diffs against this one
            if pending >= self.bucket_bytes:
                flush()
                pending = 0
        if shard:
            flush()
        index = {
            "metadata": {
                "version": version, "base_version": self.version, "chain": self.chain, "delta_encoding": self.encoding,
                "compression_format": fmt.COMPRESSION, "checksum_format": self.checksum,
            },
            "weight_map": weight_map,
        }  # fmt: skip
        (target / fmt.INDEX).write_text(json.dumps(index))
        self.version = version
        self.stats = {"written_bytes": _dir_bytes(target), "model_bytes": total, "delta_bytes": changed}
        logger.info(
            "delta weight version %d: %d of %d tensors changed, %.1f MB written for a %.1f MB model",
            version, len(weight_map), len(self.snapshot), self.stats["written_bytes"] / 1e6, total / 1e6,
        )  # fmt: skip
        return target

    def _base(self, name: str) -> tuple[np.ndarray, torch.dtype, list[int]]:
        try:
            return self.snapshot[name]
        except KeyError:
            raise WeightUpdateError(
                f"{name} is not in --hf-checkpoint {self.hf_checkpoint}, which the engines' local checkpoints start "
                "from: delta weight sync can only change tensors the checkpoint holds (use --update-weight-mode full)"
            ) from None

    def close(self) -> None:
        """Forget the chain: a transport built after a failure starts a new one from the model path."""
        self.chain = None
        self.snapshot = {}
        self.version = 0


def _read_checkpoint(checkpoint: Path) -> dict[str, tuple[np.ndarray, torch.dtype, list[int]]]:
    """Every tensor of an HF safetensors checkpoint as its raw bytes, with its dtype and shape."""
    locations = fmt.tensor_locations(checkpoint)
    if not locations:
        raise WeightUpdateError(
            f"--hf-checkpoint {checkpoint} holds no safetensors files: delta weight sync patches safetensors in place "
            "(convert the checkpoint, or use --update-weight-mode full)"
        )
    snapshot = {}
    for name, (path, offset, nbytes, info) in locations.items():
        if info["dtype"] not in _DTYPES:
            raise WeightUpdateError(
                f"{name} in {path} has dtype {info['dtype']}, which delta weight sync does not know"
            )
        data = np.fromfile(path, np.uint8, count=nbytes, offset=offset)
        snapshot[name] = (data, _DTYPES[info["dtype"]], list(info["shape"]))
    return snapshot


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


def make_delta_transport(args: Any, server_urls: list[str], disk_dir: str) -> DeltaDiskTransport:
    """The transport the weight-sync flags describe (slime_like/trainer/weights/delta_arguments.py)."""
    post_write = None
    if args.custom_update_weight_post_write_path:
        from slime_like.core.plugin_loader import load_plugin

        hook = load_plugin(args.custom_update_weight_post_write_path, "--custom-update-weight-post-write-path")
        post_write = lambda version_dir: hook(args, version_dir, list(server_urls))  # noqa: E731 - slime's contract
    return DeltaDiskTransport(
        server_urls, args.update_weight_buffer_size, hf_checkpoint=args.hf_checkpoint, disk_dir=disk_dir,
        local_dir=args.update_weight_local_checkpoint_dir, mode=args.update_weight_mode,
        encoding=args.update_weight_delta_encoding, checksum=args.update_weight_delta_checksum,
        post_write=post_write, timeout_s=args.update_weight_timeout,
    )  # fmt: skip
