"""SGLang engines as Ray actors: one actor per node an engine uses, pinned to that node's slots; and the router's actor.

An engine wider than a node runs one SGLang process per node (`--nnodes/--node-rank/--dist-init-addr`); only node
rank 0 serves HTTP and joins the router. Every actor binds the address its node registered with Ray (127.0.0.1 on
one machine) and draws its ports on its own node.
"""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from rollout.delta_pull import ENGINE_NODE_PREFIX, pull
from rollout.router import SGLangRouter
from rollout.sglang_server import SGLangServer
from slime_like.core.cluster import Slot, node_options, slot_options, where_am_i
from slime_like.core.errors import EngineError
from slime_like.core.process import PortInUseError, ProcessStartError, free_port

logger = logging.getLogger(__name__)

# What an engine actor asks of its first slot: it only watches its SGLang process, which uses the whole slot.
ENGINE_SHARE = 0.2
# Ray must not narrow CUDA_VISIBLE_DEVICES to the actor's fraction of one GPU: SGLang takes `--tp-size` GPUs
# from `--base-gpu-id` on its node.
NOSET_VISIBLE_DEVICES = {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}
START_ATTEMPTS = 3  # a port drawn free can be taken before SGLang binds it: start again on fresh ports


@dataclass
class EngineLaunch:
    """What one node's SGLang process is started with."""

    model_path: str
    dtype: str | None
    device: str  # "cuda" or "cpu"
    tp: int  # GPUs (CPU: processes) of the whole engine
    extra_args: list[str]
    log_dir: str
    startup_timeout: float
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None
    base_gpu_id: int | None = None

    def server_args(self) -> list[str]:
        """The engine-shape flags, then the user's `--sglang-*` passthrough."""
        args = ["--tp-size", str(self.tp)]
        if self.base_gpu_id is not None:
            args += ["--base-gpu-id", str(self.base_gpu_id)]
        if self.nnodes > 1:
            args += ["--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank)]
            args += ["--dist-init-addr", str(self.dist_init_addr)]
        return args + self.extra_args


class EngineNode:
    """One node's part of an SGLang engine (a Ray actor on that node): starts, watches and stops its process."""

    def __init__(self) -> None:
        self.node_id, self.host = where_am_i()
        self.server: SGLangServer | None = None

    def node(self) -> tuple[str, str]:
        """The Ray node id and address this part runs on."""
        return self.node_id, self.host

    def dist_init_address(self) -> str:
        """`host:port` free on this node, for the engine's torch.distributed rendezvous (node rank 0 only)."""
        return f"{self.host}:{free_port(self.host)}"

    def start(self, launch: EngineLaunch) -> str:
        """Start SGLang on a free port of this node and wait until it is healthy; returns its URL."""
        for attempt in range(1, START_ATTEMPTS + 1):
            self.server = SGLangServer(
                launch.model_path,
                host=self.host,
                extra_args=launch.server_args(),
                log_dir=launch.log_dir,
                startup_timeout=launch.startup_timeout,
                device=launch.device,
                dtype=launch.dtype,
                node_rank=launch.node_rank,
            )
            try:
                self.server.start()
                return self.server.url
            except (PortInUseError, ProcessStartError) as exc:
                lost_race = isinstance(exc, PortInUseError) or "address already in use" in str(exc).lower()
                if not lost_race or attempt == START_ATTEMPTS or launch.nnodes > 1:
                    raise  # a multi-node engine restarts as a whole (its other nodes expect these ports)
                logger.warning("SGLang on %s lost a port race (%s); starting again on other ports", self.host, exc)
        raise AssertionError("unreachable")

    def pid(self) -> int | None:
        """The SGLang process's pid on this node."""
        return self.server.process.pid if self.server and self.server.process else None

    def alive(self) -> bool:
        """Whether the SGLang process is running."""
        return bool(self.server and self.server.process and self.server.process.is_running())

    def sees(self, path: str) -> bool:
        """Whether `path` exists on this node (the disk transport needs a filesystem shared with the trainer)."""
        return os.path.exists(path)

    def pull_weights(self, local: str, source: str, version: int, chain: str) -> dict[str, Any] | None:
        """Delta weight sync: bring this host's copy of the model at `local` to a published version (delta_pull.py);
        None before the engine was created (a restart under way: it is brought to the current version before it
        serves). It runs beside a start under way (the actor is threaded): the pull only touches files."""
        if self.server is None:
            return None
        return {"host": self.host, **pull(local, self.server.model_path, source, version, chain)}

    def stop(self, grace: float | None = None) -> int | None:
        """Stop the SGLang process (SIGKILL after `grace` s; None: the server's own timeout); its exit status."""
        return self.server.stop(grace) if self.server else None


@dataclass
class Engine:
    """One SGLang engine: its URL (node rank 0's), its actors in node-rank order, and the slots of each."""

    index: int
    parts: list[Any]  # ActorHandle of EngineNode, node rank order
    slots: list[list[Slot]]
    url: str = ""
    pids: list[int | None] = field(default_factory=list)
    dead: bool = False  # failed a health check: out of the router, its processes stopped
    joining: bool = False  # restarted: serves once the next weight update has given it the trainer's weights
    version: int = 0  # the weight version it holds (0: its checkpoint)

    def describe(self) -> str:
        """`engine i: URL on node ... (+ nodes ...)` for the start-up placement lines."""
        where = "; ".join(f"{p[0].describe()} x{len(p)}" for p in self.slots)
        return f"engine {self.index}: {self.url or '(not started)'} on {where}"


def split_by_node(slots: list[Slot]) -> list[list[Slot]]:
    """An engine's slots cut where the node changes (the placement sorted them by node)."""
    parts: list[list[Slot]] = []
    for slot in slots:
        if parts and parts[-1][0].node_id == slot.node_id:
            parts[-1].append(slot)
        else:
            parts.append([slot])
    if len({p[0].node_id for p in parts}) != len(parts):
        raise EngineError(f"an engine's slots come back to a node: {[s.describe() for s in slots]}")
    return parts


def base_gpu_id(part: list[Slot]) -> int | None:
    """The first GPU of a part; SGLang takes consecutive GPUs from there, so they must be consecutive."""
    if part[0].gpu is None:
        return None
    gpus = [s.gpu for s in part]
    if gpus != list(range(gpus[0], gpus[0] + len(gpus))):
        raise EngineError(
            f"an engine on {part[0].describe()} got GPUs {gpus}, not consecutive: SGLang takes --tp-size GPUs "
            "from --base-gpu-id; give each node whole engines (--num-gpus-per-node a multiple of "
            "--rollout-num-gpus-per-engine)"
        )
    return gpus[0]


def start_engines(
    launch: EngineLaunch,
    engine_slots: list[list[Slot]],
    use_gpu: bool,
    env: dict[str, str],
    indices: list[int] | None = None,
    named: bool = True,
) -> list[Engine]:
    """Create every engine's actors on their nodes, start all SGLang processes at once and wait; on any failure
    stop what started and raise, naming the engine and its nodes. `indices` numbers them (default 0, 1, ...); `named`:
    their actors are found by delta weight sync (the policy's; a frozen group's take no weights)."""
    remote = ray.remote(EngineNode)
    env = {**env, **(NOSET_VISIBLE_DEVICES if use_gpu else {})}
    engines = []
    for index, slots in zip(indices or range(len(engine_slots)), engine_slots, strict=True):
        parts = split_by_node(slots)
        actors = [
            # Named, so delta weight sync finds every host of every engine (rollout/delta_pull.py).
            remote.options(
                name=f"{ENGINE_NODE_PREFIX}{index}:{rank}:{uuid.uuid4().hex[:8]}" if named else None,
                # A pull (file work on the host) or a liveness check must not wait behind a start under way.
                max_concurrency=4,
                **slot_options(p[0], ENGINE_SHARE, use_gpu, env),
            ).remote()
            for rank, p in enumerate(parts)
        ]
        engines.append(Engine(index, actors, parts))
    try:
        pending = {}
        for engine in engines:
            dist = ray.get(engine.parts[0].dist_init_address.remote()) if len(engine.parts) > 1 else None
            for rank, (actor, part) in enumerate(zip(engine.parts, engine.slots, strict=True)):
                node_launch = EngineLaunch(
                    **{**launch.__dict__, "nnodes": len(engine.parts), "node_rank": rank, "dist_init_addr": dist},
                )
                node_launch.base_gpu_id = base_gpu_id(part)
                pending[actor.start.remote(node_launch)] = (engine, rank)
        for ref, (engine, rank) in pending.items():
            try:
                url = ray.get(ref)
            except Exception as exc:
                raise EngineError(f"{engine.describe()}: node rank {rank} did not start: {exc}") from exc
            if rank == 0:
                engine.url = url
        for engine in engines:
            engine.pids = ray.get([a.pid.remote() for a in engine.parts])
    except BaseException:
        stop_engines(engines)
        raise
    return engines


def stop_engines(engines: list[Engine], timeout: float = 60.0, grace: float | None = None) -> None:
    """Stop every engine's processes (bounded; SIGKILL after `grace` s, None: the server's own timeout), then its
    actors."""
    actors = [a for e in engines for a in e.parts]
    if not actors:  # nothing to stop: a Ray call here would start a local Ray instance in a process without one
        return
    try:
        ray.get([a.stop.remote(grace) for a in actors], timeout=timeout)
    except Exception as exc:  # an actor or its node may be gone: its process died with it
        logger.warning("stopping SGLang engines: %r", exc)
    for actor in actors:
        ray.kill(actor)


class RouterHost:
    """sglang-router in its own Ray actor, bound to its node's address."""

    def __init__(self, worker_urls: list[str], policy: str | None, log_dir: str, port: int | None = None) -> None:
        _, host = where_am_i()
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        self.router = SGLangRouter(worker_urls, host=host, port=port, policy=policy, log_dir=log_dir)

    def start(self) -> str:
        """Start the router and wait until it lists every worker healthy; its URL. On `port` when given and free
        (the port of a router whose actor died), else on a free one."""
        self.router.start_or_move()
        return self.router.url

    def list_workers(self) -> list[dict[str, Any]]:
        """The router's workers as it reports them."""
        return self.router.list_workers()

    def add_worker(self, url: str) -> str:
        """Register a worker and wait until it is healthy; its id."""
        return self.router.add_worker(url)

    def remove_worker(self, url: str) -> None:
        """Deregister a worker."""
        self.router.remove_worker(url)

    def restart(self) -> tuple[str, int | None]:
        """Start a new router process with no workers (on the same port when it is free) in place of one that died or
        hung; its URL and the old process's exit status (None: it was still running and was stopped)."""
        code = self.router.restart()
        return self.router.url, code

    def pid(self) -> int | None:
        """The router process's pid."""
        return self.router.process.pid if self.router.process else None

    def returncode(self) -> int | None:
        """The router process's exit status, None while it runs."""
        return self.router.process.returncode if self.router.process else None

    def stop(self) -> int | None:
        """Stop the router process."""
        return self.router.stop()


def start_router(
    worker_urls: list[str], policy: str | None, log_dir: str, env: dict[str, str], port: int | None = None
) -> tuple[Any, str]:
    """The router actor on this process's node, started (on `port` when given and free); (handle, URL)."""
    node_id, _ = where_am_i()
    actor = ray.remote(RouterHost).options(**node_options(node_id, env)).remote(worker_urls, policy, log_dir, port)
    try:
        return actor, ray.get(actor.start.remote())
    except BaseException:
        ray.kill(actor)
        raise
