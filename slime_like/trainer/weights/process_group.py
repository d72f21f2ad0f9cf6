"""A process group between trainer rank 0 and SGLang servers, made the way SGLang makes its side.

SGLang's /init_weights_update_group joins a group through a tcp:// rendezvous whose store is
prefixed with the group name; the trainer must build its side with the same recipe to meet it.
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d


def init_weight_sync_group(
    backend: str, master_address: str, master_port: int, world_size: int, group_name: str, timeout_s: float = 120.0
) -> dist.ProcessGroup:
    """Join as rank 0 (the broadcaster); blocks until every server has joined or the timeout passes."""
    timeout = timedelta(seconds=timeout_s)
    store, rank, world_size = next(
        c10d.rendezvous(f"tcp://{master_address}:{master_port}", 0, world_size, timeout=timeout)
    )
    store.set_timeout(timeout)
    pg, _ = c10d._new_process_group_helper(
        world_size,
        rank,
        [],
        c10d.Backend(backend),
        c10d.PrefixStore(group_name, store),
        group_name=group_name,
        timeout=timeout,
    )
    # Ranks inside this group are its own 0..n-1, not the trainer's global ranks.
    c10d._world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg
