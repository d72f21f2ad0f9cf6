"""The engine fleet: the SGLang engines of one model group and the router in front of them.

One owner for their lifetime (start, stop), their health (--use-fault-tolerance: a monitor thread per engine set and
one for the router), recovery (a dead engine restarts at once on its own thread, tried again until it is back; a
policy engine joins the router once it holds the current weights, from rollout/catch_up.py or the next weight
update; a dead router restarts, on its port when free) and the monitors' pause state while weights move. The rollout proper (rollout/manager.py)
only reads the router's URL and the servers' URLs from it.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import ray

from rollout import sglang_client as client
from rollout.arguments import server_dtype
from rollout.engines import Engine, EngineLaunch, start_engines, start_router, stop_engines
from rollout.fleet_restarts import EngineRestarts
from rollout.health import HealthMonitor
from rollout.router import SGLangRouter
from slime_like.core.cluster import Slot
from slime_like.core.errors import EngineError

logger = logging.getLogger(__name__)
FAILED_ENGINE_GRACE = 2.0  # seconds between SIGTERM and SIGKILL for an engine taken out as failed


@dataclass
class FleetSpec:
    """What one model group serves: its checkpoint, engine shape, SGLang flags, and whether it takes weight updates."""

    name: str
    model_path: str
    num_gpus_per_engine: int
    dtype: str | None
    extra_args: list[str] = field(default_factory=list)
    update_weights: bool = True  # the policy's group; a frozen one (teacher, reward model) keeps its checkpoint


def policy_spec(args: Any) -> FleetSpec:
    """The policy's group from the rollout flags: --hf-checkpoint on --rollout-num-gpus-per-engine, behind a router."""
    return FleetSpec(
        name="policy",
        model_path=args.hf_checkpoint,
        num_gpus_per_engine=args.rollout_num_gpus_per_engine,
        dtype=server_dtype(args),  # the trainer's: else SGLang serves an fp32 checkpoint in fp16
        extra_args=list(args.sglang_server_args),
    )


class EngineFleet(EngineRestarts):
    """The engines of one model group and their router: started here, or servers started elsewhere (`attach`)."""

    def __init__(self, args: Any, spec: FleetSpec) -> None:
        self.args = args
        self.spec = spec
        self.log_dir = str(Path(args.output_dir) / "logs")
        self.engines: list[Engine] = []
        self._engines_lock = threading.Lock()
        self.monitor: HealthMonitor | None = None
        self.router_monitor: HealthMonitor | None = None  # with --use-fault-tolerance: restarts a dead router
        self.engine_failures = self.engines_restarted = self.router_restarts = 0
        self.router: Any = None  # a local SGLangRouter (external servers) or a RouterHost actor
        # Held while the router is restarted or its workers change (the health threads and the update both do it).
        self._router_lock = threading.RLock()
        self._router_down: str | None = None  # why the router is down and could not be restarted (fault tolerance)
        self._followers: dict[int, Any] = {}  # objects with a `router_url` (open rollout contexts): told when it moves
        self._closing = False
        self._heal_lock = threading.Lock()  # one `heal` at a time (the health thread and the weight update both heal)
        self.updating = False  # between `recover` and `rejoin`: the health checks are paused
        self.version = 0  # the weight version the engines in the router hold
        self._targets: list[Engine] = []  # the engines the weight update under way was given
        self._restart_lock = threading.RLock()  # held while dead engines restart or restarted ones catch up
        self._restarter: threading.Thread | None = None  # restarts dead engines as soon as they are found
        self._stopping = threading.Event()  # set when the fleet stops: the restart thread ends
        self._server_urls: list[str] = []
        self.router_url: str | None = None

    # --- start and stop ---

    def start(self, engine_slots: list[list[Slot]], use_gpu: bool, env: dict[str, str]) -> None:
        """Start one engine per slot list on its nodes, then the router actor on this node; the health monitors with
        --use-fault-tolerance."""
        if not engine_slots:
            raise EngineError(f"{self._name()}no engine slots given: the placement reserved no rollout GPUs")
        spec = self.spec
        self._launch = EngineLaunch(
            model_path=spec.model_path,
            dtype=spec.dtype,
            device="cuda" if use_gpu else "cpu",
            tp=spec.num_gpus_per_engine,
            extra_args=list(spec.extra_args),
            log_dir=self.log_dir,
            startup_timeout=self.args.sglang_startup_timeout,
        )
        self._use_gpu, self._env = use_gpu, env
        self.engines = start_engines(self._launch, engine_slots, use_gpu, env, named=spec.update_weights)
        try:
            self._server_urls = [e.url for e in self.engines]
            self.router, self.router_url = start_router(self._server_urls, self.args.router_policy, self.log_dir, env)
            for engine in self.engines:
                logger.info("%s%s", self._name(), engine.describe())
            self.set_weight_version(0)
        except BaseException:
            self.stop()
            raise
        if self.args.use_fault_tolerance:
            self._start_monitors()

    def attach(self, server_urls: list[str], router_url: str | None) -> None:
        """Use servers started elsewhere (never stopped here); without `router_url`, a local router in front of them."""
        self._server_urls = list(server_urls)
        self.router_url = router_url
        if router_url is None:
            Path(self.log_dir).mkdir(parents=True, exist_ok=True)
            self.router = SGLangRouter(self._server_urls, policy=self.args.router_policy, log_dir=self.log_dir)
            self.router.start_or_move()
            self.router_url = self.router.url

    def _start_monitors(self) -> None:
        args = self.args
        self.monitor = HealthMonitor(
            lambda: [e for e in self.engines if not e.dead and not e.joining],
            self._check_engine,
            self._engine_failed,
            args.rollout_health_check_interval,
            args.rollout_health_check_first_wait,
            name=f"{self._thread_prefix()}engine-health",
        )
        self.monitor.start()
        # Its own thread: a hung engine's check must not delay it, and a failed request wakes it at once.
        self.router_monitor = HealthMonitor(
            lambda: [self.router_url],
            self._check_router,
            self._router_failed,
            args.rollout_health_check_interval,
            name=f"{self._thread_prefix()}router-health",
        )
        self.router_monitor.start()

    def stop_monitors(self) -> None:
        """From now on nothing is restarted (shutting down)."""
        self._closing = True
        self._stopping.set()
        for monitor in (self.monitor, self.router_monitor):
            if monitor is not None:
                monitor.stop()

    def stop(self) -> None:
        """Stop the router and every engine this fleet started."""
        self.stop_monitors()
        with self._router_lock:  # after a restart still under way
            if isinstance(self.router, SGLangRouter):
                self.router.stop()
            elif self.router is not None:
                try:
                    ray.get(self.router.stop.remote(), timeout=30)
                except Exception as exc:  # its node may be gone, and the router with it
                    logger.warning("%sstopping the router: %r", self._name(), exc)
                ray.kill(self.router)
            self.router = None
        stop_engines(self.engines)
        self.engines = []

    def _thread_prefix(self) -> str:
        return "" if self.spec.name == "policy" else f"{self.spec.name}-"

    def _name(self) -> str:
        """A log prefix naming the group, empty for the policy (its lines read as before model groups existed)."""
        return "" if self.spec.name == "policy" else f"model group {self.spec.name!r}: "

    # --- engine health ---

    def _check_engine(self, engine: Engine) -> None:
        """Raise unless every node's SGLang process runs and node rank 0 generates within the timeout."""
        timeout = self.args.rollout_health_check_timeout
        if not all(ray.get([a.alive.remote() for a in engine.parts], timeout=timeout)):
            raise EngineError(f"{self._name()}{engine.describe()}: its SGLang process exited")
        client.health_generate(engine.url, timeout)

    def _probe(self, engine: Engine) -> Exception | None:
        """The health check's failure, or None."""
        try:
            self._check_engine(engine)
        except Exception as error:  # any failure means the engine cannot serve
            return error
        return None

    def _engine_failed(self, engine: Engine, error: Exception, what: str = "failed its health check") -> None:
        """Take a failed engine out of the router and stop its processes; it restarts at once (`restart_soon`)."""
        with self._engines_lock:
            if engine.dead or engine not in self.engines:
                return
            engine.dead = True
            self.engine_failures += 1
        logger.warning("%s%s %s (%s): taken out of the router and restarted", self._name(), engine.describe(), what,
                       error)  # fmt: skip
        if self.router is not None and not engine.joining:  # a restarted one waiting for weights was never in it
            try:
                ray.get(self.router.remove_worker.remote(engine.url), timeout=60)
            except Exception as exc:  # the router may have dropped it already
                logger.warning("removing %s from the router: %r", engine.url, exc)
        # A failed engine gets no graceful shutdown: its requests have failed over already, and a hung one would
        # only spend SGLangServer's 15 s SIGTERM wait (half of a hung engine's restart in the fault tests).
        stop_engines([engine], timeout=30, grace=FAILED_ENGINE_GRACE)
        self.restart_soon()

    def heal(self, wait: bool = True) -> int:
        """A frozen group (teacher, reward model): restart its dead engines now and put them straight back into its
        router, as they serve their own checkpoint; how many came back. Without `wait`, nothing if one runs."""
        if not self._heal_lock.acquire(blocking=wait):
            return 0
        try:
            try:
                self.recover()
            finally:
                joined = self.rejoin()  # resumes the health checks even when a restart failed (tried again later)
        finally:
            self._heal_lock.release()
        return joined

    def recover(self) -> list[str]:
        """Before a weight update: pause the health checks, check every engine once more, restart every dead one on
        its slots (out of the router until `rejoin`); returns every engine's URL, the restarted ones' new."""
        self.updating = True
        for monitor in (self.monitor, self.router_monitor):
            if monitor is not None:
                monitor.pause()
        # One that died since the last check must not take the update down with it: check all, side by side
        # (/health_generate takes a second or more each).
        live = [e for e in self.engines if not e.dead]
        with ThreadPoolExecutor(max_workers=max(1, len(live))) as pool:
            errors = list(pool.map(self._probe, live))
        for engine, error in zip(live, errors, strict=True):
            if error is not None:
                self._engine_failed(engine, error)
        with self._restart_lock:  # after a restart under way on the restart thread
            self._restart_dead()
            self._targets = [e for e in self.engines if not e.dead]
        return self.server_urls()

    def verdict(self, urls: list[str], cause: str) -> list[str]:
        """A weight update failed (`cause`): check the engines at `urls` (processes running, HTTP answering: /health
        hangs while paused); each that fails is taken out and restarts at once. The URLs still alive."""
        engines = [e for e in self.engines if e.url in urls and not e.dead]
        with ThreadPoolExecutor(max_workers=max(1, len(engines))) as pool:
            errors = list(pool.map(self._reachable, engines))
        for engine, error in zip(engines, errors, strict=True):
            if error is not None:
                self._engine_failed(engine, error, f"failed during a weight update ({cause})")
        alive = {e.url for e in self.engines if not e.dead}
        return [url for url in urls if url in alive or not self.engines]  # servers started elsewhere: not ours

    def _reachable(self, engine: Engine) -> Exception | None:
        """Why the engine cannot take weights (a process exited, its server does not answer), or None."""
        timeout = self.args.rollout_health_check_timeout
        try:
            if not all(ray.get([a.alive.remote() for a in engine.parts], timeout=timeout)):
                raise EngineError(f"{engine.describe()}: its SGLang process exited")
            client.get(engine.url, "/get_model_info", timeout=timeout)
        except Exception as error:  # any failure means it cannot take the weights
            return error
        return None

    def behind(self) -> list[str]:
        """The URLs of live engines that lack the weight version the router's engines hold (restarted ones)."""
        return [e.url for e in self.engines if not e.dead and e.version != self.version]

    def live_urls(self) -> list[str]:
        """The servers not taken out (all of them when started elsewhere)."""
        return [e.url for e in self.engines if not e.dead] if self.engines else self.server_urls()

    def rejoin(self, version: int | None = None) -> int:
        """After a weight update to `version` (None: a frozen group's heal): the engines it reached hold it; restarted
        ones among them join the router; the health checks resume. Returns how many joined."""
        if self.spec.update_weights:
            self.version = self.version if version is None else version
            for engine in self._targets:
                engine.version = self.version
        self._targets = []
        try:
            joined = self._join([e for e in self.engines if e.joining and not e.dead and
                                 (not self.spec.update_weights or e.version == self.version)])  # fmt: skip
        finally:
            for monitor in (self.monitor, self.router_monitor):
                if monitor is not None:
                    monitor.resume()
            self.updating = False
        if any(e.dead or e.joining for e in self.engines):  # died meanwhile, or restarted too late for this update
            self.restart_soon()
        return joined

    # --- router health ---

    def follow(self, holder: Any) -> None:
        """`holder.router_url` (an open rollout context's) is kept current when a restarted router moves port."""
        self._followers[id(holder)] = holder
        holder.router_url = self.router_url  # registered first: a router that moves from now on updates it

    def unfollow(self, holder: Any) -> None:
        """Stop updating `holder`."""
        self._followers.pop(id(holder), None)

    def _check_router(self, url: str, timeout: float | None = None) -> None:
        """Raise unless the router answers /health within `timeout` (default: the health check timeout)."""
        client.get(url, "/health", timeout=timeout or self.args.rollout_health_check_timeout)

    def _router_answers(self) -> bool:
        """Whether the router answers /health now (a second look after a failure: a hung one has had its time)."""
        try:
            self._check_router(self.router_url, timeout=min(5.0, self.args.rollout_health_check_timeout))
        except EngineError:
            return False
        return True

    def _router_failed(self, url: str, error: Exception) -> None:
        """The router failed its health check: restart it, unless it was restarted since the check began."""
        with self._router_lock:
            if self._closing or url != self.router_url or self._router_answers():
                return  # shutting down, or restarted since the check began (the port may have moved)
            self._restart_router(error)

    def _restart_router(self, error: Exception) -> None:
        """(Router lock held.) A new router process in place of the dead one (in a new actor if its actor died too),
        on its port when free, and every live engine registered with it again (restarted ones waiting for their
        first update join in `rejoin`)."""
        old = self.router_url
        try:
            try:
                url, code = ray.get(self.router.restart.remote(), timeout=300)
                died = "was hung and was stopped" if code is None else f"exited with code {code}"
            except ray.exceptions.RayActorError as exc:  # the router process died with it: a new actor, same node
                port = urlsplit(old).port
                self.router, url = start_router([], self.args.router_policy, self.log_dir, self._env, port)
                died = f"died with its Ray actor ({type(exc).__name__})"
        except Exception as exc:
            self._router_down = f"sglang-router at {old} failed ({error}) and could not be restarted: {exc}"
            raise EngineError(self._name() + self._router_down) from exc
        self._router_down = None
        self.router_restarts += 1
        if url != old:  # the old port was taken: every request from now on goes to the new one
            self.router_url = url
            for holder in list(self._followers.values()):
                holder.router_url = url
        live = [e for e in self.engines if not e.dead and not e.joining]
        for engine in live:
            try:
                ray.get(self.router.add_worker.remote(engine.url), timeout=120)
            except Exception as exc:  # it does not pass the router's check: restarted at the next weight update
                self._engine_failed(engine, exc)
        logger.warning("%ssglang-router at %s failed (%s; its process %s): router restarted at %s with %d engine(s) "
                       "registered again (restart %d)", self._name(), old, error, died, url, len(live),
                       self.router_restarts)  # fmt: skip

    def request_failed(self) -> None:
        """A request through the router failed: with fault tolerance check the router now."""
        if self.router_monitor is not None:
            self.router_monitor.wake()

    def router_failure(self) -> str | None:
        """Why the router is gone (then the rollout cannot go on), or None: without fault tolerance, its process
        exited; with it, it could not be restarted."""
        if self.router_monitor is not None:
            with self._router_lock:
                if self._router_down is not None and not self._closing:
                    # The health thread will try again, but this rollout needs an answer now: one more attempt.
                    with suppress(EngineError):
                        self._restart_router(EngineError(self._router_down))
                return self._router_down
        if isinstance(self.router, SGLangRouter):
            code = self.router.process.returncode if self.router.process else None
        elif self.router is not None:
            try:
                code = ray.get(self.router.returncode.remote(), timeout=60)
            except Exception as exc:  # its actor is gone, and the router process with it
                return f"sglang-router at {self.router_url} is gone with its Ray actor ({exc!r})"
        else:
            return None  # a router started elsewhere: not ours to watch
        if code is None:
            return None
        return (
            f"sglang-router at {self.router_url} exited with code {code}: every request through it fails "
            "(see its log under --output-dir/logs; --use-fault-tolerance restarts it)"
        )

    def check_router_after(self, what: str, error: BaseException | None = None) -> None:
        """Raise EngineError naming the router if it is gone after `what` (from `error`, the failure it caused)."""
        failure = self.router_failure()
        if failure is not None:
            raise EngineError(f"{what}: {self._name()}{failure}") from error

    # --- what the run and the rollout read ---

    def metrics(self) -> dict[str, int]:
        """The fault-tolerance counters (none without the monitors)."""
        if self.monitor is None:
            return {}
        return {
            "engine_failures": self.engine_failures,
            "engines_restarted": self.engines_restarted,
            "router_restarts": self.router_restarts,
        }

    def server_urls(self) -> list[str]:
        """Base URLs of the SGLang servers (for weight updates)."""
        return list(self._server_urls)

    def set_weight_version(self, version: int) -> None:
        """Tag the servers' current weights (samples record it)."""
        client.on_all(self.server_urls(), client.set_weight_version, version)

    def release_memory(self) -> None:
        """Colocated on GPU: free the servers' weights and KV cache while the trainer runs."""
        client.on_all(self.server_urls(), client.release_memory)

    def resume_memory(self) -> None:
        """Colocated on GPU: take the memory back before weights are updated and generation resumes."""
        client.on_all(self.server_urls(), client.resume_memory)

    def layout(self) -> list[dict[str, Any]]:
        """Each engine's URL, and per node rank its Ray node id and SGLang pid (placement lines, tests)."""
        return [{"url": e.url, "nodes": [p[0].node_id for p in e.slots], "pids": list(e.pids)} for e in self.engines]

    def router_info(self) -> dict[str, Any]:
        """The router's URL, its process's pid (None for one started elsewhere) and the workers it lists."""
        if self.router_url is None:  # --debug-train-only: no servers, no router
            return {"url": None, "pid": None, "workers": []}
        if isinstance(self.router, SGLangRouter):
            pid = self.router.process.pid if self.router.process else None
        else:
            pid = ray.get(self.router.pid.remote(), timeout=60) if self.router is not None else None
        return {"url": self.router_url, "pid": pid, "workers": client.list_workers(self.router_url)}

    def paths_unseen(self, path: str) -> list[str]:
        """The engine nodes on which `path` does not exist (the disk transport needs a shared filesystem)."""
        unseen = []
        for engine in self.engines:
            seen = ray.get([a.sees.remote(path) for a in engine.parts])
            unseen += [f"{engine.url} ({p[0].describe()})" for p, ok in zip(engine.slots, seen, strict=True) if not ok]
        return unseen
