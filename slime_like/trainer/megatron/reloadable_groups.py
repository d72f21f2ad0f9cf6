"""Process groups whose communicators can be destroyed (freeing NCCL's GPU buffers) and made again later.

Megatron's parallel state, its DDP gradient buffers and the distributed optimizer keep Python references to
the groups that `torch.distributed.new_group` returned. To free a communicator and build it again, those
references must stay valid: inside `enable_reloadable_groups()`, new_group returns a `ReloadableProcessGroup`
instead, a `ProcessGroup` subclass that holds the real group (`inner`) and forwards every method to it.
`destroy_reloadable_groups()` destroys the inner groups; `reload_reloadable_groups()` replays the recorded
new_group calls and swaps the fresh groups in, so every holder of a wrapper sees the new communicator.

Only groups that take the world's backend (no `backend=` given: NCCL on GPU) are wrapped. Groups asked for
another backend explicitly (Megatron's gloo side groups on an NCCL world) hold no GPU memory, stay plain and
can be destroyed by Megatron as usual. The default group (made by init_process_group, not new_group) is kept.

torch internals this relies on (checked on torch 2.13): c10d's module-level `_world` maps, which get_rank,
get_world_size, get_process_group_ranks, get_backend and the collectives look groups up in; and c10d's
collectives calling methods of the group object (group.allreduce(...), group._get_backend(...), ...).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

logger = logging.getLogger(__name__)

# The new_group calls for the world's backend made while enabled, in order: (args, kwargs, the wrapper, or None
# on a rank outside the group). reload replays all of them, non-member calls included: c10d names groups from a
# counter that must advance the same way on every rank, and new_group's store barrier may wait for every rank.
_CALLS: list[tuple[tuple, dict, ReloadableProcessGroup | None]] = []
_ORIGINAL_NEW_GROUP = dist.new_group

# The wrapper's own C++ ProcessGroup base has no backend: these members of the base class are answered by the
# inner group instead. rank()/size() come from the base (set once, the same after a reload); the rest are
# pybind plumbing, the constructor, a static method, or shutdown (defined on the class below).
_NOT_FORWARDED = {"__init__", "_pybind11_conduit_v1_", "rank", "size", "unbox", "shutdown"}


class ReloadableProcessGroup(dist.ProcessGroup):
    """A process group whose communicator can be destroyed and rebuilt; this Python object stays the same."""

    def __init__(self, inner: dist.ProcessGroup) -> None:
        super().__init__(inner.rank(), inner.size())
        self.inner: dist.ProcessGroup | None = inner
        self._name = inner.group_name  # kept for c10d's bookkeeping while destroyed

    def _live(self) -> dist.ProcessGroup:
        if self.inner is None:
            raise RuntimeError(
                "process group used while destroyed (destroy_reloadable_groups without reload_reloadable_groups)"
            )
        return self.inner

    def shutdown(self) -> None:
        # destroy_process_group(WORLD) shuts every registered group down; a destroyed one has nothing to shut.
        if self.inner is not None:
            self.inner.shutdown()

    def __repr__(self) -> str:
        return (
            f"ReloadableProcessGroup({self._name}, rank {self.rank()} of {self.size()}, live={self.inner is not None})"
        )


def _forward_method(name: str) -> Any:
    def method(self: ReloadableProcessGroup, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._live(), name)(*args, **kwargs)

    method.__name__ = name
    return method


def _forward_property(name: str) -> property:
    def get(self: ReloadableProcessGroup) -> Any:
        # group_name stays readable while destroyed: destroy_process_group and repr ask for it.
        if name == "group_name" and self.inner is None:
            return self._name
        return getattr(self._live(), name)

    return property(get)


# Generated from the base class rather than listed, so that every collective, point-to-point and query c10d or
# Megatron may call (allreduce, _allgather_base, allgather_into_tensor_coalesced, _reduce_scatter_base, send,
# recv, barrier, _start_coalescing, _get_backend, bound_device_id, ...) reaches the live group on any torch.
for _name, _member in vars(dist.ProcessGroup).items():
    if _name in _NOT_FORWARDED or isinstance(_member, type) or isinstance(_member, dist.ProcessGroup.BackendType):
        continue
    if isinstance(_member, property):
        setattr(ReloadableProcessGroup, _name, _forward_property(_name))
    elif callable(_member):
        setattr(ReloadableProcessGroup, _name, _forward_method(_name))


def _register(wrapper: ReloadableProcessGroup) -> None:
    """Give the wrapper the inner group's entries in c10d's world maps, so lookups by group object find it."""
    world, inner = c10d._world, wrapper.inner
    world.pg_map[wrapper] = world.pg_map[inner]  # get_backend, "is this a registered group" checks
    world.pg_names[wrapper] = world.pg_names[inner]
    world.pg_group_ranks[wrapper] = world.pg_group_ranks[inner]  # get_rank, get_process_group_ranks
    world.pg_backend_config[wrapper] = world.pg_backend_config[inner]
    world.pg_to_tag[wrapper] = world.pg_to_tag[inner]  # functional collectives' group tag
    wrapper._name = inner.group_name


def _unregister(wrapper: ReloadableProcessGroup) -> None:
    """Drop the wrapper's entries, as destroy_process_group drops a group's (a reload may reuse the name)."""
    world = c10d._world
    for table in (world.pg_map, world.pg_names, world.pg_group_ranks, world.pg_backend_config, world.pg_to_tag):
        table.pop(wrapper, None)
    world.pg_coalesce_state.pop(wrapper, None)


def _new_group(*args: Any, **kwargs: Any) -> Any:
    """new_group as Megatron calls it, returning a ReloadableProcessGroup for the world's backend."""
    group = _ORIGINAL_NEW_GROUP(*args, **kwargs)
    # The same decision on every rank (it depends on the call only), so that replays stay in step.
    if kwargs.get("backend", args[2] if len(args) > 2 else None) is not None:
        return group
    wrapper = None
    if isinstance(group, dist.ProcessGroup):  # a rank outside the group gets NON_GROUP_MEMBER, not a group
        wrapper = ReloadableProcessGroup(group)
        _register(wrapper)
        group = wrapper
    _CALLS.append((args, kwargs, wrapper))
    return group


@contextmanager
def enable_reloadable_groups() -> Iterator[None]:
    """Within: torch.distributed.new_group returns reloadable groups (wrap mpu.initialize_model_parallel)."""
    _CALLS.clear()  # a new Megatron parallel state: the groups recorded before are no longer in use
    # Megatron calls torch.distributed.new_group; c10d's own helpers (new_subgroups...) call the module global.
    dist.new_group = c10d.new_group = _new_group
    try:
        yield
    finally:
        dist.new_group = c10d.new_group = _ORIGINAL_NEW_GROUP


def reloadable_groups() -> list[ReloadableProcessGroup]:
    """The wrappers made so far on this rank, in creation order."""
    return [wrapper for _, _, wrapper in _CALLS if wrapper is not None]


def destroy_reloadable_groups() -> int:
    """Destroy every inner group (NCCL frees its communicators' buffers); returns how many were destroyed.

    Collective in spirit: every rank calls it at the same point (communicators are torn down in one order).
    """
    count = 0
    for wrapper in reloadable_groups():
        if wrapper.inner is None:
            continue
        _unregister(wrapper)
        dist.destroy_process_group(wrapper.inner)
        wrapper.inner = None
        count += 1
    return count


def reload_reloadable_groups() -> int:
    """Create the inner groups again (same ranks, backend, timeout, options); returns how many were made.

    Every rank must call it (the replayed new_group calls synchronise over the world).
    """
    destroyed = [wrapper for wrapper in reloadable_groups() if wrapper.inner is None]
    if not destroyed:
        return 0
    if len(destroyed) != len(reloadable_groups()):
        raise RuntimeError("reload_reloadable_groups: some groups are live, some destroyed; destroy all first")
    for args, kwargs, wrapper in _CALLS:
        group = _ORIGINAL_NEW_GROUP(*args, **kwargs)
        if wrapper is not None:
            wrapper.inner = group
            _register(wrapper)
    return len(destroyed)
