"""Launch sglang-router in front of SGLang servers and add or remove workers while it runs.

Shapes seen on sglang-router 0.3.2: GET /workers -> {"workers": [{"id", "url", "is_healthy", ...}], "total", "stats"};
POST /workers {"url"} -> 202 {"status": "accepted", "worker_id", ...} and the worker appears in GET /workers only once
its health check passed; DELETE /workers/{id} -> 202, the worker disappears shortly after; GET /workers/{id} of a
pending addition shows its "job_status". The router's /health answers 200 before any worker is registered.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import requests

from slime_like.process import ManagedProcess, check_port_free, free_port


def _norm(url: str) -> str:
    """Compare worker URLs without a trailing slash."""
    return url.rstrip("/")


class SGLangRouter:
    """One `python -m sglang_router.launch_router` process routing to SGLang workers."""

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
    ) -> None:
        self.worker_urls = [_norm(u) for u in worker_urls]
        self.host = host
        self.port = port
        self.policy = policy
        self.extra_args = list(extra_args)
        self.log_dir = Path(log_dir) if log_dir else None
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        """The router's base URL (known once start() has chosen the port)."""
        if self.port is None:
            raise RuntimeError("SGLangRouter has no port yet: call start() first")
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        """The launch command line."""
        cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", self.host, "--port", str(self.port)]
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
        self.process = ManagedProcess(self.command(), log_dir / f"router_{self.port}.log", name=name).start()
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

    def stop(self) -> int | None:
        """Stop the router (SIGTERM, SIGKILL after `stop_timeout`); return its exit status."""
        return self.process.stop(self.stop_timeout) if self.process else None

    def __enter__(self) -> SGLangRouter:
        return self if self.process else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def list_workers(self) -> list[dict[str, Any]]:
        """The router's workers as it reports them (each with id, url, is_healthy, load, ...)."""
        resp = requests.get(f"{self.url}/workers", timeout=10)
        resp.raise_for_status()
        return resp.json()["workers"]

    def add_worker(self, url: str, timeout: float = 60.0) -> str:
        """Register a worker and wait until the router lists it healthy; return its worker id."""
        url = _norm(url)
        resp = requests.post(f"{self.url}/workers", json={"url": url}, timeout=10)
        if resp.status_code not in (200, 202):
            raise RuntimeError(f"router {self.url} refused to add worker {url}: HTTP {resp.status_code} {resp.text}")
        worker_id = resp.json().get("worker_id")
        try:
            self._wait_workers(
                lambda ws: self._healthy(ws, url), time.monotonic() + timeout, f"worker {url} is listed healthy"
            )
        except TimeoutError as exc:
            job = self._job_status(worker_id)
            if worker_id:
                # Otherwise the router keeps retrying the unreachable worker in the background for minutes.
                requests.delete(f"{self.url}/workers/{worker_id}", timeout=10)
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
            resp = requests.delete(f"{self.url}/workers/{worker_id}", timeout=10)
            if resp.status_code not in (200, 202, 204):
                raise RuntimeError(f"router {self.url} refused to remove {url}: HTTP {resp.status_code} {resp.text}")
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
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                listed = [(w["url"], "healthy" if w.get("is_healthy") else "unhealthy") for w in workers]
                tail = self.process.tail_log(20) if self.process else ""
                raise TimeoutError(
                    f"router {self.url}: timed out waiting until {what}; it lists {listed}. "
                    f"Is each worker up and answering /health?\n--- router log tail ---\n{tail}"
                )
            time.sleep(0.25)

    def _job_status(self, worker_id: str | None) -> Any:
        """The router's background job status for a worker id, if it still has one."""
        if not worker_id:
            return None
        try:
            return requests.get(f"{self.url}/workers/{worker_id}", timeout=5).json().get("job_status")
        except (requests.RequestException, ValueError):
            return None
