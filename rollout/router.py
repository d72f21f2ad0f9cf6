"""Launch sglang-router in front of SGLang servers and add or remove workers while it runs.

The router's /health answers 200 before any worker is registered, so readiness waits until it lists the
workers healthy; its HTTP calls are in sglang_client.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rollout import sglang_client as client
from slime_like.core.errors import EngineError
from slime_like.core.process import ManagedProcess, PortInUseError, ProcessStartError, check_port_free, free_port
from slime_like.core.secret import API_KEY_ENV, LAUNCH_WITH_KEY, run_secret

logger = logging.getLogger(__name__)


# `sglang_router.launch_router` imports its Python load balancer (`mini_lb`, used only with --mini-lb) at module level,
# and that imports all of sglang, torch and torchvision: measured on 2 cores, 6.3 CPU-seconds before the Rust router
# even starts, against 0.1 without it (`python -X importtime`: mini_lb is 8.0 of the module's 8.1 s). A stand-in takes
# mini_lb's place and imports the real one only if it is called; then the secret launcher runs launch_router as it is.
LAUNCH_ROUTER = (
    """
import importlib, sys, types


def _mini_lb(*args, **kwargs):
    sys.modules.pop("sglang_router.mini_lb", None)
    return importlib.import_module("sglang_router.mini_lb").MiniLoadBalancer(*args, **kwargs)


_stand_in = types.ModuleType("sglang_router.mini_lb")
_stand_in.MiniLoadBalancer = _mini_lb
sys.modules["sglang_router.mini_lb"] = _stand_in
"""
    + LAUNCH_WITH_KEY
)


def _norm(url: str) -> str:
    """Compare worker URLs without a trailing slash."""
    return url.rstrip("/")


class SGLangRouter:
    """One `sglang_router.launch_router` process (started by LAUNCH_ROUTER) routing to SGLang workers."""

    def __init__(
        self,
        worker_urls: Sequence[str] = (),
        host: str = "127.0.0.1",
        port: int | None = None,
        policy: str | None = None,
        extra_args: Sequence[str] = (),
        log_dir: str | Path | None = None,
        startup_timeout: float = 60.0,
        stop_timeout: float = 10.0,
        api_key: str | None = None,
    ) -> None:
        self.worker_urls = [_norm(u) for u in worker_urls]
        self.host = host
        self.port = port
        self.policy = policy
        self.extra_args = list(extra_args)
        self.log_dir = Path(log_dir) if log_dir else None
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        # The router demands it of every client and sends it to its workers; None: this process's run secret.
        self.api_key = api_key if api_key is not None else run_secret()
        self.process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        """The router's base URL (known once start() has chosen the port)."""
        if self.port is None:
            raise RuntimeError("SGLangRouter has no port yet: call start() first")
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        """The launch command line (the secret, if any, goes in the environment: see start())."""
        # LAUNCH_ROUTER adds the key from the environment only when it is set there.
        cmd = [sys.executable, "-c", LAUNCH_ROUTER, "sglang_router.launch_router", "--host", self.host]
        cmd += ["--port", str(self.port)]
        if self.worker_urls:
            cmd += ["--worker-urls", *self.worker_urls]
        if self.policy:
            cmd += ["--policy", self.policy]
        if "--prometheus-port" not in self.extra_args:
            # The default 29000 on 0.0.0.0 makes a second router on the machine panic at start-up.
            cmd += ["--prometheus-port", str(free_port(self.host)), "--prometheus-host", self.host]
        return cmd + self.extra_args

    def start(self) -> SGLangRouter:
        """Launch the router and wait until it answers and lists every initial worker as healthy."""
        if self.process is not None:
            raise RuntimeError(f"router at {self.url} was already started")
        if self.port is None:
            self.port = free_port(self.host)
        check_port_free(self.host, self.port)
        log_dir = self.log_dir or Path(tempfile.mkdtemp(prefix="slime_like_router_"))
        name = f"sglang-router (port {self.port})"
        env = {API_KEY_ENV: self.api_key or ""}  # empty: no key, whatever this process's environment holds
        self.process = ManagedProcess(self.command(), log_dir / f"router_{self.port}.log", env=env, name=name).start()
        try:
            deadline = time.monotonic() + self.startup_timeout
            self.process.wait_http_ok(f"{self.url}/health", timeout=self.startup_timeout, what="ready")
            # /health is 200 before any worker is registered: readiness means the workers are in.
            ready = lambda ws: all(self._healthy(ws, u) for u in self.worker_urls)  # noqa: E731
            self._wait_workers(ready, deadline, f"workers {self.worker_urls} are listed healthy")
        except BaseException:
            self.stop()
            raise
        return self

    def restart(self, worker_urls: Sequence[str] = ()) -> int | None:
        """Replace a dead (or hung) router process: stop what is left of it, start a new one with `worker_urls` on
        the same port (clients keep their URL), or on a free port when that one is taken. Returns the old
        process's exit status (None: it was still running, e.g. hung, and was stopped here)."""
        old = self.process.returncode if self.process else None
        if self.process is not None:
            self.process.stop(self.stop_timeout)  # also ends whatever is left in its process group
            self.process = None
        self.worker_urls = [_norm(u) for u in worker_urls]
        self.start_or_move()
        return old

    def start_or_move(self) -> SGLangRouter:
        """start(), on a free port instead when the port (chosen or drawn) is taken by the time the router binds it."""
        try:
            return self.start()
        except (PortInUseError, ProcessStartError) as exc:
            if not isinstance(exc, PortInUseError) and "address already in use" not in str(exc).lower():
                raise
            cause = str(exc).splitlines()[0]
            logger.warning("sglang-router: port %s was taken meanwhile (%s); starting on a free port", self.port, cause)
            self.process, self.port = None, None
            return self.start()

    def stop(self) -> int | None:
        """Stop the router (SIGTERM, SIGKILL after `stop_timeout`); return its exit status."""
        return self.process.stop(self.stop_timeout) if self.process else None

    def __enter__(self) -> SGLangRouter:
        return self if self.process else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def list_workers(self) -> list[dict[str, Any]]:
        """The router's workers as it reports them (each with id, url, is_healthy, load, ...)."""
        return client.list_workers(self.url)

    def add_worker(self, url: str, timeout: float = 60.0) -> str:
        """Register a worker and wait until the router lists it healthy; return its worker id."""
        url = _norm(url)
        worker_id = client.add_worker(self.url, url)
        try:
            self._wait_workers(
                lambda ws: self._healthy(ws, url), time.monotonic() + timeout, f"worker {url} is listed healthy"
            )
        except TimeoutError as exc:
            job = client.worker_job_status(self.url, worker_id) if worker_id else None
            if worker_id:
                # Otherwise the router keeps retrying the unreachable worker in the background for minutes.
                with contextlib.suppress(EngineError):
                    client.delete_worker(self.url, worker_id)
            raise TimeoutError(f"{exc}; router job status: {job}") from None
        return worker_id or next(w["id"] for w in self.list_workers() if _norm(w["url"]) == url)

    def remove_worker(self, url: str, timeout: float = 30.0) -> None:
        """Deregister a worker by URL and wait until the router no longer lists it."""
        url = _norm(url)
        workers = self.list_workers()
        ids = [w["id"] for w in workers if _norm(w["url"]) == url]
        if not ids:
            listed = [w["url"] for w in workers]
            raise KeyError(f"router {self.url} has no worker {url}; it lists {listed}")
        for worker_id in ids:
            client.delete_worker(self.url, worker_id)
        gone = lambda ws: all(_norm(w["url"]) != url for w in ws)  # noqa: E731
        self._wait_workers(gone, time.monotonic() + timeout, f"worker {url} is no longer listed")

    @staticmethod
    def _healthy(workers: list[dict[str, Any]], url: str) -> bool:
        """Whether `url` is listed and healthy."""
        return any(_norm(w["url"]) == url and w.get("is_healthy") for w in workers)

    def _wait_workers(self, done: Callable[[list[dict[str, Any]]], bool], deadline: float, what: str) -> None:
        """Poll GET /workers until `done(workers)`; raise TimeoutError (or the router's death) otherwise."""
        workers: list[dict[str, Any]] = []
        while True:
            if self.process is not None:
                self.process.check_alive(f"waiting until {what}")
            try:
                workers = self.list_workers()
                if done(workers):
                    return
            except EngineError:
                pass
            if time.monotonic() > deadline:
                listed = [(w["url"], "healthy" if w.get("is_healthy") else "unhealthy") for w in workers]
                tail = self.process.tail_log(20) if self.process else ""
                raise TimeoutError(
                    f"router {self.url}: timed out waiting until {what}; it lists {listed}. "
                    f"Is each worker up and answering /health?\n--- router log tail ---\n{tail}"
                )
            time.sleep(0.25)
