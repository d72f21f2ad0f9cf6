"""Run CPU-bound scoring functions in killable worker processes, with a real timeout from any thread or loop.

math-verify's own timeouts use `signal.alarm`, which only works on the main thread; sympy can also hang on
pathological answers. Here each call goes to a long-lived worker process (`python -m rollout.reward_worker`)
over a pipe; a call that runs past its timeout has its worker killed (and a fresh one started on the next call).
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from slime_like.core.process import forking


class WorkerError(RuntimeError):
    """The scoring function raised in the worker, or the worker died."""


class _Worker:
    """One worker process and its pipes."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        with forking():  # no port probe of this process open while it forks (slime_like/core/process.py)
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "rollout.reward_worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                start_new_session=True,  # a Ctrl-C in the terminal reaches the run, not the workers mid-call
            )
        self._buffer = b""

    def call(self, target: str, args: list[Any], timeout: float | None) -> Any:
        """Send one call and wait for its answer; TimeoutError after `timeout` seconds."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"target": target, "args": args}).encode() + b"\n")
        self.proc.stdin.flush()
        deadline = None if timeout is None else time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], left)[0]:
                raise TimeoutError(f"{target} did not answer within {timeout}s")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise WorkerError(f"reward worker died (exit status {self.proc.wait()}) while running {target}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        answer = json.loads(line)
        if "error" in answer:
            raise WorkerError(answer["error"])
        return answer["ok"]

    def kill(self) -> None:
        """Kill the process (it may be stuck in a call)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class WorkerPool:
    """`num_workers` worker processes, one per executor thread, started on first use."""

    def __init__(self, num_workers: int = 2, timeout: float | None = 30.0) -> None:
        self.timeout = timeout
        self._executor = ThreadPoolExecutor(max_workers=max(1, num_workers), thread_name_prefix="reward-worker")
        self._local = threading.local()
        self._workers: set[_Worker] = set()
        self._lock = threading.Lock()
        self.restarts = 0

    def _call(self, target: str, args: list[Any]) -> Any:
        worker: _Worker | None = getattr(self._local, "worker", None)
        if worker is None or worker.proc.poll() is not None:
            worker = _Worker()
            self._local.worker = worker
            with self._lock:
                self._workers.add(worker)
        try:
            return worker.call(target, args, self.timeout)
        except (TimeoutError, WorkerError, OSError) as exc:
            if isinstance(exc, WorkerError) and worker.proc.poll() is None:
                raise  # the function raised; the worker itself is fine
            # Stuck or dead: its state is unknown, so it is replaced by a fresh process on the next call.
            worker.kill()
            self._local.worker = None
            with self._lock:
                self._workers.discard(worker)
                self.restarts += 1
            raise

    async def run(self, target: str, *args: Any) -> Any:
        """Call `target` ("package.module:function") with JSON-able `args` in a worker; returns its JSON result."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._call, target, list(args))

    def close(self) -> None:
        """Kill every worker and stop the threads."""
        with self._lock:
            workers, self._workers = list(self._workers), set()
        for worker in workers:
            worker.kill()
        self._executor.shutdown(wait=False, cancel_futures=True)
