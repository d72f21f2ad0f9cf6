"""The engine fleet's restarts (--use-fault-tolerance), a part of rollout/fleet.py's EngineFleet: a dead engine is
restarted at once on a thread of its own, again after a pause when a start fails, until every engine is back; a frozen
group's joins its router at once (it serves its own checkpoint, and its adapter, from its server flags), the policy's
once it holds the weight version the others serve: brought there here when rollout/catch_up.py can (version 0, delta
weight sync), else by the next weight update, which targets it with the others."""

from __future__ import annotations

import logging
import threading
from typing import Any

import ray

from rollout.catch_up import can_catch_up, catch_up, checkpoint_version
from rollout.engines import Engine, start_engines, stop_engines

logger = logging.getLogger(__name__)


class EngineRestarts:
    """Restarting and bringing in engines; the state it uses is EngineFleet's."""

    args: Any
    spec: Any
    engines: list[Engine]
    monitor: Any
    router: Any
    updating: bool
    version: int
    engines_restarted: int
    _closing: bool
    _engines_lock: threading.Lock
    _router_lock: threading.RLock
    _restart_lock: threading.RLock
    _restarter: threading.Thread | None
    _stopping: threading.Event
    _server_urls: list[str]

    def restart_soon(self) -> None:
        """With the monitors (--use-fault-tolerance): restart dead engines now, on a thread of their own, until every
        one is back (a failed start is logged and tried again); restarted engines join the router as `_bring_in`
        says. One such thread at a time: it looks for dead engines again before it ends."""
        if self.monitor is None or self._closing:
            return
        with self._engines_lock:
            if self._restarter is not None and self._restarter.is_alive():
                return
            self._restarter = threading.Thread(target=self._restart_loop, name=f"{self._thread_prefix()}engine-restart",
                                               daemon=True)  # fmt: skip
            self._restarter.start()

    def _restart_loop(self) -> None:
        delay = 2.0
        while not self._closing:
            try:
                with self._restart_lock:
                    self._restart_dead()
                    self._bring_in()
            except Exception as exc:  # a start that failed (a port race, a slow node): again after a pause
                logger.error("%srestarting dead engines failed (%s); trying again in %.0f s", self._name(), exc, delay)
                self._stopping.wait(delay)
                delay = min(2 * delay, 60.0)
                continue
            with self._engines_lock:
                if not any(e.dead for e in self.engines):
                    self._restarter = None
                    return

    def _bring_in(self) -> None:
        """(Restart lock held.) Restarted engines join the router: a frozen group's at once; the policy's once they
        hold the current weights (brought here when rollout/catch_up.py can, else by the next update), never while an
        update is under way (its `rejoin` joins those it reached)."""
        if self.spec.update_weights:
            if self.updating:
                return
            for engine in [e for e in self.engines if e.joining and not e.dead and e.version != self.version]:
                if can_catch_up(self.args, self.version):
                    catch_up(self.args, engine, self.version)
        self._join([e for e in self.engines if e.joining and not e.dead and
                    (not self.spec.update_weights or e.version == self.version)])  # fmt: skip

    def _restart_dead(self) -> None:
        """(Restart lock held.) Start every dead engine again on its slots, out of the router (`joining`)."""
        with self._engines_lock:
            dead = [e for e in self.engines if e.dead]
        if not dead:
            return
        slots = [[slot for part in e.slots for slot in part] for e in dead]
        fresh = start_engines(self._launch, slots, self._use_gpu, self._env, [e.index for e in dead],
                              named=self.spec.update_weights)  # fmt: skip
        if self._closing:  # stopped meanwhile: nothing may outlive the fleet
            stop_engines(fresh)
            return
        with self._engines_lock:
            for new in fresh:
                new.joining = True
                new.version = checkpoint_version(self.args)  # in a LoRA run none: it holds no adapter yet
                self.engines[new.index] = new
                when = "once it holds the current weights" if self.spec.update_weights else "again now"
                logger.info("%srestarted %s; it serves %s", self._name(), new.describe(), when)
        self.engines_restarted += len(fresh)
        self._server_urls = [e.url for e in self.engines]

    def _join(self, engines: list[Engine]) -> int:
        """Put restarted engines into the router; how many."""
        with self._router_lock:
            for engine in engines:
                engine.joining = False
            if self.router is not None:
                try:
                    for engine in engines:
                        ray.get(self.router.add_worker.remote(engine.url))
                except Exception as exc:
                    if self._router_answers():
                        raise  # the engine's fault, not the router's
                    self._restart_router(exc)  # registers every live engine, these included
        for engine in engines:
            logger.info("%s%s joined the router at weight version %d", self._name(), engine.describe(), engine.version)
        return len(engines)
