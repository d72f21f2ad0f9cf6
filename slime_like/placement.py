"""Ray placement: one placement group; trainer ranks and rollout share bundles (colocated) or not."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

# Every process Ray starts for us: one thread per process (2-core machines; SGLang measured 3-5x
# slower with 2 threads under contention) and no model hub.
WORKER_ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@dataclass
class Placement:
    """Where each part runs: bundle indices of trainer ranks and of the rollout side."""

    group: PlacementGroup
    actor_bundles: list[int]
    rollout_bundle: int
    rollout_gpu_offset: int  # first GPU index used by SGLang servers on the rollout node
    share: float  # fraction of a bundle each part asks for (0.5 when colocated)
    use_gpu: bool

    def options(self, bundle: int, **extra: Any) -> dict[str, Any]:
        """Ray actor options that pin an actor to a bundle."""
        strategy = PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=bundle)
        opts = {"num_cpus": self.share, "scheduling_strategy": strategy, **extra}
        if self.use_gpu:
            opts["num_gpus"] = self.share
        return opts


def start_ray(args: Any) -> None:
    """Connect to the cluster in RAY_ADDRESS, or start a local instance sized for this machine."""
    if ray.is_initialized():
        return
    runtime_env = {"env_vars": WORKER_ENV}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], runtime_env=runtime_env)
        return
    # Cap the object store: SGLang servers share this machine's memory.
    ray.init(
        num_cpus=args.ray_num_cpus,
        include_dashboard=False,
        object_store_memory=1 << 30,
        runtime_env=runtime_env,
        log_to_driver=True,
    )


def create_placement(args: Any) -> Placement:
    """Reserve bundles for trainer ranks and rollout; colocated runs put both on the same bundles."""
    import torch

    use_gpu = torch.cuda.is_available()
    bundle = {"CPU": 1, **({"GPU": 1} if use_gpu else {})}
    if args.colocate:
        n = max(args.world_size, args.rollout_num_gpus)
        group = placement_group([bundle] * n, strategy="PACK")
        placement = Placement(group, list(range(args.world_size)), 0, 0, 0.5, use_gpu)
    else:
        n = args.world_size + args.rollout_num_gpus
        group = placement_group([bundle] * n, strategy="PACK")
        placement = Placement(group, list(range(args.world_size)), args.world_size, args.world_size, 1.0, use_gpu)
    try:
        ray.get(group.ready(), timeout=120)
    except ray.exceptions.GetTimeoutError:
        raise RuntimeError(
            f"Ray could not place {n} bundles of {bundle} in 120 s; the cluster has {ray.cluster_resources()}. "
            "Lower --actor-num-nodes/--actor-num-gpus-per-node/--rollout-num-gpus, use --colocate, "
            "or add nodes (ray start --address HEAD:6379 on each)"
        ) from None
    return placement
