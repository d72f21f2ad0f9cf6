"""Daemon threads for plain-def reward functions: a call that never returns holds neither shutdown nor exit.

`concurrent.futures.ThreadPoolExecutor` threads are joined at interpreter exit (and they are not daemon
threads), so one reward call stuck forever kept the whole process alive after the run had finished. These
threads are daemons that nothing joins: a stuck call keeps only its own thread, until the process ends.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class RewardThreads:
    """Up to `size` daemon threads, started on demand, running submitted calls in order of submission."""

    def __init__(self, size: int, name: str = "reward") -> None:
        self.size = size
        self.name = name
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # released by a thread each time it waits for work
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._running = 0  # calls started and not returned (a stuck one stays counted)
        self._closed = False

    def submit(self, call: Callable[[], Any]) -> Future[Any]:
        """Run `call()` in one of the threads; its result or exception lands in the returned future."""
        future: Future[Any] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name} threads are closed")
            self._queue.put((future, call))
            # A new thread only when none waits idle: busy (or stuck) threads do not take new work.
            if not self._idle.acquire(blocking=False) and len(self._threads) < self.size:
                thread = threading.Thread(target=self._work, name=f"{self.name}_{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
        return future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, call = item
            del item
            if not future.set_running_or_notify_cancel():
                self._idle.release()
                continue
            with self._lock:
                self._running += 1
            error: BaseException | None = None
            try:
                result = call()
            except BaseException as exc:  # handed to the caller, like an executor does
                error, result = exc, None
            with self._lock:
                self._running -= 1
            # Idle (and not counted as running) before the caller sees the result, so its next call reuses this thread.
            self._idle.release()
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)
            del future, call, result, error  # a finished call's arguments and result must not live on while idle

    def close(self) -> int:
        """Cancel calls not started, let idle threads end; returns how many calls still run (not waited for)."""
        with self._lock:
            self._closed = True
            threads, running = len(self._threads), self._running
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in range(threads):
            self._queue.put(None)
        return running
