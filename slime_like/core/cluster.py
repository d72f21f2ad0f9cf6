"""Where things run on the Ray cluster: placement-group slots with their node and device, and actor options."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from slime_like.core.secret import API_KEY_ENV, ensure_api_key

# Set for every process of a CPU run (2-core machines: SGLang was measured 3-5x slower with 2 threads per
# process under contention; no model hub). A value in the driver's environment wins.
CPU_ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@dataclass(frozen=True)
class Slot:
    """One bundle of a placement group (one GPU, or one CPU on a CPU run): its node and its device."""

    group: PlacementGroup
    bundle: int
    node_id: str
    node_ip: str
    gpu: int | None  # the physical GPU index on its node (None on CPU)

    def describe(self) -> str:
        """`node <ip>/<id prefix> gpu <n>` for start-up lines and errors."""
        device = f" gpu {self.gpu}" if self.gpu is not None else ""
        return f"node {self.node_ip}/{self.node_id[:8]}{device}"


def cpu_env() -> dict[str, str]:
    """The CPU-run environment, where the driver's own values override ours."""
    return {key: os.environ.get(key, value) for key, value in CPU_ENV.items()}


def actor_env(env: dict[str, str] | None) -> dict[str, str]:
    """`env` plus the run's secret: every actor we place talks to the servers (or starts them) with it.

    The driver makes the secret when it places its first actor; an actor placing others passes its own on."""
    return {**(env or {}), API_KEY_ENV: ensure_api_key()}


def slot_options(slot: Slot, share: float, use_gpu: bool, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Ray options that pin an actor to a slot, asking for `share` of its CPU (and GPU)."""
    options: dict[str, Any] = {
        "num_cpus": share,
        "scheduling_strategy": PlacementGroupSchedulingStrategy(slot.group, placement_group_bundle_index=slot.bundle),
    }
    if use_gpu:
        options["num_gpus"] = share
    options["runtime_env"] = {"env_vars": actor_env(env)}
    return options


def node_options(node_id: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Ray options that pin a light actor (router, rollout manager) to one node without reserving a core."""
    options: dict[str, Any] = {
        "num_cpus": 0,
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False),
        "runtime_env": {"env_vars": actor_env(env)},
    }
    return options


def where_am_i() -> tuple[str, str]:
    """This process's Ray node id and the address the node registered under."""
    return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()
