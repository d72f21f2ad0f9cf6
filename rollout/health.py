"""The engine health monitor of --use-fault-tolerance: checks each live engine every interval, reports failures."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


class HealthMonitor:
    """A daemon thread calling `check(engine)` on each of `engines()` every `interval` s (after `first_wait`), and
    `on_failure(engine, error)` when a check raises; paused while weights are updated."""

    def __init__(
        self,
        engines: Callable[[], list[Any]],
        check: Callable[[Any], None],
        on_failure: Callable[[Any, Exception], None],
        interval: float,
        first_wait: float = 0.0,
    ) -> None:
        self._engines, self._check, self._on_failure = engines, check, on_failure
        self.interval, self.first_wait = interval, first_wait
        self._stop = threading.Event()
        self._running = threading.Event()  # cleared while paused
        self._running.set()
        self._thread = threading.Thread(target=self._loop, name="engine-health", daemon=True)

    def start(self) -> None:
        """Begin checking (after the first wait)."""
        self._thread.start()

    def pause(self) -> None:
        """Stop checking until `resume` (weights are being updated: engines are paused and restarting)."""
        self._running.clear()

    def resume(self) -> None:
        """Check again."""
        self._running.set()

    def stop(self, timeout: float = 10.0) -> None:
        """End the thread (bounded)."""
        self._stop.set()
        self._running.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        if self._stop.wait(self.first_wait):
            return
        while not self._stop.is_set():
            self._running.wait()
            for engine in self._engines():
                if self._stop.is_set() or not self._running.is_set():
                    break
                try:
                    self._check(engine)
                except Exception as error:  # any failure of a check means the engine cannot serve
                    if self._running.is_set():  # a pause began meanwhile: the update restarts engines itself
                        self._on_failure(engine, error)
            self._stop.wait(self.interval)
