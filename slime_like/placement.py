"""Ray placement: placement groups for trainer ranks and engines, their slots sorted by node, and node-loss watch."""

from __future__ import annotations

import ipaddress
import logging
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from slime_like.core.cluster import Slot, cpu_env, slot_options, where_am_i
from slime_like.core.errors import ArgumentError, NodeLostError

PLACEMENT_TIMEOUT = 120.0
NODE_DEATH_GRACE = 30.0  # Ray marks a node dead after its missed health checks
# What a dead node's engines and actors look like from elsewhere (requests, aiohttp, Ray).
NODE_DEATH_SYMPTOMS = (
    "Connection refused",
    "Cannot connect to host",
    "Connect call failed",
    "Server disconnected",
    "ActorUnavailableError",
    "ActorDiedError",
)


def _stay_on_loopback() -> None:
    """Keep Ray's node and driver addresses at 127.0.0.1: Ray otherwise swaps it for the interface address (and a
    driver then cannot reach a GCS listening on loopback). Ray reads the switch at import, so set both."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray._private.ray_constants.ENABLE_RAY_CLUSTER = False


def start_ray(args: Any) -> None:
    """Connect to the cluster in RAY_ADDRESS, or start a local instance sized for this machine on 127.0.0.1."""
    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    if address:
        if address.split(":")[0] in ("127.0.0.1", "localhost"):  # a cluster on this machine only
            _stay_on_loopback()
        # Workers on other nodes start from their raylet's environment: hand them the driver's PYTHONPATH (plugin
        # modules live there; the same paths must exist on every node, as with `ray job submit`).
        env = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
        ray.init(address=address, log_to_driver=True, runtime_env={"env_vars": env})
        return
    # One machine: the node registers under loopback, so every engine and the router bind 127.0.0.1 only.
    _stay_on_loopback()
    # Ray 2.60 turns token authentication on for a new local instance (kept: the instance runs our code) and warns
    # that it did, at every start; RAY_AUTH_MODE set by the user still decides.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    # The object store is capped: SGLang servers share this machine's memory.
    ray.init(
        address="local",  # never join another Ray instance that happens to run on this machine
        num_cpus=args.ray_num_cpus,
        include_dashboard=False,
        object_store_memory=1 << 30,
        log_to_driver=True,
        _node_ip_address="127.0.0.1",
    )


def cluster_has_gpus(args: Any) -> bool:
    """--device, or for `auto` whether the Ray cluster offers GPUs (not whether the driver's machine has one)."""
    if args.device != "auto":
        return args.device == "cuda"
    return ray.cluster_resources().get("GPU", 0) > 0


@dataclass
class Placement:
    """The slots of trainer ranks (rank order) and of engines (engine order), sorted by node then GPU."""

    trainer: list[Slot]
    rollout: list[Slot]
    colocated: bool
    use_gpu: bool
    env: dict[str, str]  # for every actor we start (CPU runs: one thread per process, no model hub)
    driver_node: str
    groups: list[PlacementGroup] = field(default_factory=list)

    def trainer_options(self, rank: int, **extra: Any) -> dict[str, Any]:
        """Ray options of trainer rank `rank` (half a slot when colocated: the engine shares it)."""
        share = 0.5 if self.colocated else 1.0
        return {**slot_options(self.trainer[rank], share, self.use_gpu, self.env), **extra}

    def engine_slots(self, per_engine: int) -> list[list[Slot]]:
        """The rollout slots cut into engines of `per_engine` slots."""
        return [self.rollout[i : i + per_engine] for i in range(0, len(self.rollout) - per_engine + 1, per_engine)]

    def nodes(self, engines: list[dict[str, Any]] | None = None) -> dict[str, list[str]]:
        """node id -> what we placed there, e.g. `trainer ranks 0-1`, `engine 0 (URL)` (start-up lines, node loss)."""
        held: dict[str, list[str]] = defaultdict(list)
        by_node: dict[str, list[int]] = defaultdict(list)
        for rank, slot in enumerate(self.trainer):
            by_node[slot.node_id].append(rank)
        for node, ranks in by_node.items():
            held[node].append(f"trainer rank{'s' if len(ranks) > 1 else ''} {_span(ranks)}")
        for i, engine in enumerate(engines or []):
            for rank, node in enumerate(engine["nodes"]):
                part = f" node rank {rank}" if len(engine["nodes"]) > 1 else ""
                held[node].append(f"engine {i}{part} ({engine['url']})")
        return held

    def describe(self, engines: list[dict[str, Any]]) -> list[str]:
        """One line per node: its address and what runs there (trainer ranks, engines with their URLs)."""
        held = self.nodes(engines)
        held[self.driver_node].append("driver, rollout manager, router")
        address = {s.node_id: s.node_ip for s in self.trainer + self.rollout}
        return [f"  node {address.get(n, '?')}/{n[:8]}: " + ", ".join(what) for n, what in held.items()]

    def lost_nodes(self, engines: list[dict[str, Any]] | None = None) -> list[str]:
        """Nodes we placed something on that Ray no longer lists alive, each with what it held."""
        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        ours = {s.node_id: s.node_ip for s in self.trainer + self.rollout}
        held = self.nodes(engines)
        return [
            f"node {ip}/{node[:8]} (held {', '.join(held[node]) or 'nothing yet'})"
            for node, ip in ours.items()
            if node not in alive
        ]

    def get(self, refs: Any, what: str, engines: list[dict[str, Any]] | None = None, poll: float = 2.0) -> Any:
        """`ray.get(refs)`, but raise NodeLostError naming the node and what it held as soon as one of ours dies."""
        pending = refs if isinstance(refs, list) else [refs]
        while True:
            try:
                ready, _ = ray.wait(pending, num_returns=len(pending), timeout=poll)
                if len(ready) == len(pending):
                    return ray.get(refs)
            except Exception as exc:
                lost = self._lost_after(exc, engines)
                if lost:
                    raise NodeLostError(_node_lost(what, lost)) from exc
                raise
            lost = self.lost_nodes(engines)
            if lost:
                raise NodeLostError(_node_lost(what, lost))

    def _lost_after(self, error: Exception, engines: list[dict[str, Any]] | None) -> list[str]:
        """After a failure that a dead node causes (an actor gone, a server refusing connections), the nodes Ray
        reports dead, waiting up to NODE_DEATH_GRACE s for Ray to notice (its health checks lag the first symptom)."""
        symptom = isinstance(error, ray.exceptions.RayActorError) or any(s in str(error) for s in NODE_DEATH_SYMPTOMS)
        deadline = time.monotonic() + (NODE_DEATH_GRACE if symptom else 0)
        while True:
            lost = self.lost_nodes(engines)
            if lost or time.monotonic() >= deadline:
                return lost
            time.sleep(1)


def _node_lost(what: str, lost: list[str]) -> str:
    return (
        f"lost {'; '.join(lost)} while {what}. The run stops; resume it with --load <--save dir> once the "
        "cluster has the nodes again (the last checkpoint is named in the log)"
    )


def _span(ranks: list[int]) -> str:
    """`0-3` for consecutive ranks, else `0, 2`."""
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 1:
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))


@ray.remote(num_cpus=0)
def _gpu_of_bundle() -> int:
    """The physical GPU index Ray gave this task's bundle."""
    return int(ray.get_gpu_ids()[0])


def _node_sort_key(ip: str) -> tuple[int, ...]:
    """Sort nodes by address (numerically where it is one)."""
    try:
        return tuple(ipaddress.ip_address(ip).packed)
    except ValueError:
        return tuple(map(ord, ip))


def sorted_slots(group: PlacementGroup, use_gpu: bool) -> list[Slot]:
    """The group's bundles as slots, sorted by node address, node id and GPU, so that consecutive slots share a
    node where they can (engines and trainer ranks take consecutive slots)."""
    node_of = placement_group_table(group)["bundles_to_node_id"]
    address = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    gpus: list[int | None] = [None] * len(node_of)
    if use_gpu:  # which GPU each bundle holds is known only inside it
        probes = [
            _gpu_of_bundle.options(
                num_gpus=0.01,
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=b),
            ).remote()
            for b in range(len(node_of))
        ]
        gpus = list(ray.get(probes))
    slots = [Slot(group, b, node_of[b], address.get(node_of[b], "?"), gpus[b]) for b in range(len(node_of))]
    return sorted(slots, key=lambda s: (_node_sort_key(s.node_ip), s.node_id, s.gpu or 0, s.bundle))


def _reserve(n: int, bundle: dict[str, float], what: str) -> PlacementGroup:
    """A PACK placement group of n bundles, ready, or an error naming what the cluster has."""
    group = placement_group([bundle] * n, strategy="PACK")
    try:
        ray.get(group.ready(), timeout=PLACEMENT_TIMEOUT)
    except ray.exceptions.GetTimeoutError:
        ray.util.remove_placement_group(group)
        raise ArgumentError(
            f"Ray could not place {n} bundles of {bundle} for {what} in {PLACEMENT_TIMEOUT:.0f} s; the cluster has "
            f"{ray.cluster_resources()} over {sum(1 for n in ray.nodes() if n['Alive'])} node(s). Lower "
            "--actor-num-nodes/--actor-num-gpus-per-node/--rollout-num-gpus, use --colocate, or add nodes "
            "(`ray start --address HEAD:6379` on each)"
        ) from None
    return group


def create_placement(args: Any) -> Placement:
    """Reserve slots for trainer ranks and engines (the same slots when colocated) and sort them by node."""
    use_gpu = cluster_has_gpus(args)
    bundle = {"CPU": 1, **({"GPU": 1} if use_gpu else {})}
    env = {} if use_gpu else cpu_env()
    if args.device == "cpu" and ray.cluster_resources().get("GPU", 0) > 0:
        env["CUDA_VISIBLE_DEVICES"] = ""  # --device cpu on GPU nodes: keep torch and SGLang off the GPUs
    driver_node, _ = where_am_i()
    if args.colocate:
        group = _reserve(max(args.world_size, args.rollout_num_gpus), bundle, "trainer ranks and engines")
        slots = sorted_slots(group, use_gpu)
        placement = Placement(
            slots[: args.world_size], slots[: args.rollout_num_gpus], True, use_gpu, env, driver_node, [group]
        )
    else:
        # Trainer ranks first, so they pack onto their own nodes; the engines take the next free slots.
        trainer = _reserve(args.world_size, bundle, "trainer ranks")
        # --rollout-external-engine-addrs: the servers run outside the run, on devices it does not reserve (as slime)
        external = bool(getattr(args, "rollout_external_engine_addrs", None))
        rollout = None if external else _reserve(args.rollout_num_gpus, bundle, "engines")
        placement = Placement(
            sorted_slots(trainer, use_gpu),
            [] if rollout is None else sorted_slots(rollout, use_gpu),
            False,
            use_gpu,
            env,
            driver_node,
            [trainer] if rollout is None else [trainer, rollout],
        )
    return placement
