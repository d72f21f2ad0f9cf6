"""Distributed transport: trainer rank 0 broadcasts each bucket to every server over one process group.

Servers join through /init_weights_update_group; for every bucket they are told names, dtypes and
shapes by /update_weights_from_distributed (SGLang's "flattened_bucket" format) and receive the bucket
as one flat broadcast (gloo on CPU, NCCL on GPU), the in-place path RL engines use when training and
rollout are on separate devices. Every wait is bounded by `timeout_s`: a dead or stalled server makes
the update fail with WeightUpdateError, and the next update builds a fresh group.
"""

from __future__ import annotations

import itertools
import os
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist

from slime_like.process import free_port
from slime_like.weights.base import NamedTensors, WeightTransport, buckets, flat_size, flatten_into
from slime_like.weights.process_group import init_weight_sync_group
from slime_like.weights.server_calls import WeightUpdateError, post

_group_ids = itertools.count()


class DistributedTransport(WeightTransport):
    """Broadcast over a process group of trainer rank 0 plus every server's TP ranks."""

    name = "distributed"

    def __init__(
        self,
        server_urls: list[str],
        bucket_bytes: int,
        *,
        tp_per_server: int = 1,
        master_address: str = "127.0.0.1",
        timeout_s: float = 120.0,
    ) -> None:
        super().__init__(server_urls, bucket_bytes, timeout_s)
        self.tp_per_server = tp_per_server
        self.master_address = master_address
        self.backend = "nccl" if torch.cuda.is_available() else "gloo"
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
        self.group: dist.ProcessGroup | None = None
        self.group_name = ""
        self._buffer: torch.Tensor | None = None

    def connect(self) -> None:
        """Create the group: every server joins (in threads) while this process joins as rank 0."""
        if self.group is not None:
            self.close()
        # A fresh name each time: torch refuses to reuse a group name within a process.
        self.group_name = f"slime-weights-{os.getpid()}-{next(_group_ids)}"
        port = free_port(self.master_address)
        world_size = 1 + len(self.server_urls) * self.tp_per_server
        with ThreadPoolExecutor(max_workers=len(self.server_urls)) as pool:
            joins = [
                pool.submit(
                    post,
                    url,
                    "/init_weights_update_group",
                    {
                        "master_address": self.master_address,
                        "master_port": port,
                        "rank_offset": 1 + i * self.tp_per_server,
                        "world_size": world_size,
                        "group_name": self.group_name,
                        "backend": self.backend,
                    },
                    self.timeout_s,
                )
                for i, url in enumerate(self.server_urls)
            ]
            try:
                self.group = init_weight_sync_group(
                    self.backend, self.master_address, port, world_size, self.group_name, self.timeout_s
                )
            except Exception as exc:  # a server that never joined: report it, the caller may retry
                raise WeightUpdateError(f"weight-sync group {self.group_name} not formed: {exc!r}") from exc
            for join in joins:
                join.result()

    def _flat_buffer(self, nbytes: int) -> torch.Tensor:
        """A reusable send buffer of at least `nbytes` (on the GPU with NCCL)."""
        if self._buffer is None or self._buffer.numel() < nbytes:
            self._buffer = torch.empty(max(nbytes, self.bucket_bytes), dtype=torch.uint8, device=self.device)
        return self._buffer

    def send(self, named_tensors: NamedTensors, version: int) -> None:
        """Per bucket: announce it to every server (HTTP, in threads) and broadcast it flattened."""
        if self.group is None:
            self.connect()
        with ThreadPoolExecutor(max_workers=len(self.server_urls)) as pool:
            for bucket in buckets(named_tensors, self.bucket_bytes):
                payload = {
                    "names": [name for name, _ in bucket],
                    "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in bucket],
                    "shapes": [list(t.shape) for _, t in bucket],
                    "group_name": self.group_name,
                    "load_format": "flattened_bucket",
                    "flush_cache": False,
                }
                flat, _ = flatten_into(bucket, self._flat_buffer(flat_size(bucket)))
                answers = [
                    pool.submit(post, url, "/update_weights_from_distributed", payload, self.timeout_s)
                    for url in self.server_urls
                ]
                try:
                    dist.broadcast(flat, group_src=0, group=self.group)
                except Exception as exc:
                    raise WeightUpdateError(f"broadcast to the servers failed: {exc!r}") from exc
                for answer in answers:
                    answer.result()

    def close(self) -> None:
        """Leave the group on both sides (best effort: a dead server cannot answer)."""
        if self.group is None:
            return
        for url in self.server_urls:
            try:
                post(url, "/destroy_weights_update_group", {"group_name": self.group_name}, self.timeout_s)
            except WeightUpdateError:
                pass
        try:
            dist.destroy_process_group(self.group)
        except Exception:  # a group broken by a failed broadcast: nothing left to release
            pass
        self.group = None
