"""Distributed transport: trainer rank 0 broadcasts each tensor to every server over one process group.

Servers join through /init_weights_update_group; for every bucket they are told names, dtypes and
shapes by /update_weights_from_distributed and receive the tensors by broadcast (gloo on CPU,
NCCL on GPU), the in-place path RL engines use when training and rollout are on separate devices.
"""

from __future__ import annotations

import itertools
import os
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist

from slime_like.process import free_port
from slime_like.weights.base import NamedTensors, WeightTransport, buckets
from slime_like.weights.process_group import init_weight_sync_group
from slime_like.weights.server_calls import WeightUpdateError, flush_cache, on_all, post

_group_ids = itertools.count()


class DistributedTransport(WeightTransport):
    """Broadcast over a process group of trainer rank 0 plus every server's TP ranks."""

    def __init__(
        self,
        server_urls: list[str],
        bucket_bytes: int,
        *,
        tp_per_server: int = 1,
        master_address: str = "127.0.0.1",
        timeout_s: float = 120.0,
    ) -> None:
        super().__init__(server_urls, bucket_bytes)
        self.tp_per_server = tp_per_server
        self.master_address = master_address
        self.timeout_s = timeout_s
        self.backend = "nccl" if torch.cuda.is_available() else "gloo"
        self.group: dist.ProcessGroup | None = None
        self.group_name = ""

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

    def send(self, named_tensors: NamedTensors, version: int) -> None:
        """Flush, then per bucket announce (HTTP) and broadcast the tensors, then tag the version and flush."""
        if self.group is None:
            self.connect()
        on_all(self.server_urls, flush_cache)
        for bucket in buckets(named_tensors, self.bucket_bytes):
            payload = {
                "names": [name for name, _ in bucket],
                "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in bucket],
                "shapes": [list(t.shape) for _, t in bucket],
                "group_name": self.group_name,
                "flush_cache": False,
            }
            with ThreadPoolExecutor(max_workers=len(self.server_urls)) as pool:
                answers = [
                    pool.submit(post, url, "/update_weights_from_distributed", payload, self.timeout_s)
                    for url in self.server_urls
                ]
                try:
                    for _, tensor in bucket:
                        dist.broadcast(tensor.detach().contiguous(), group_src=0, group=self.group)
                except Exception as exc:
                    raise WeightUpdateError(f"broadcast to the servers failed: {exc!r}") from exc
                for answer in answers:
                    answer.result()
        on_all(
            self.server_urls, post, "/update_weight_version", {"new_version": str(version), "abort_all_requests": False}
        )
        on_all(self.server_urls, flush_cache)

    def close(self) -> None:
        """Leave the group on both sides (best effort: a dead server cannot answer)."""
        if self.group is None:
            return
        for url in self.server_urls:
            try:
                post(url, "/destroy_weights_update_group", {"group_name": self.group_name}, timeout=30)
            except WeightUpdateError:
                pass
        dist.destroy_process_group(self.group)
        self.group = None
