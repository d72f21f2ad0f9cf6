"""The health monitor of --use-fault-tolerance: checks each target (an engine, the router) every interval on its own
thread and reports failures."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


class HealthMonitor:
    """A daemon thread calling `check(target)` on each of `targets()` every `interval` s (after `first_wait`), and
    `on_failure(target, error)` when a check raises; paused while weights are updated, woken early by `wake`."""

    def __init__(
        self,
        targets: Callable[[], list[Any]],
        check: Callable[[Any], None],
        on_failure: Callable[[Any, Exception], None],
        interval: float,
        first_wait: float = 0.0,
        name: str = "engine-health",
    ) -> None:
        self._targets, self._check, self._on_failure = targets, check, on_failure
        self.interval, self.first_wait = interval, first_wait
        self._stop = threading.Event()
        self._wake = threading.Event()  # set: the next check is due now
        self._running = threading.Event()  # cleared while paused
        self._running.set()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        """Begin checking (after the first wait)."""
        self._thread.start()

    def pause(self) -> None:
        """Stop checking until `resume` (weights are being updated: engines are paused and restarting)."""
        self._running.clear()

    def resume(self) -> None:
        """Check again."""
        self._running.set()

    def wake(self) -> None:
        """Check now rather than at the end of the interval (a request just failed); once paused, at `resume`."""
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        """End the thread (bounded)."""
        self._stop.set()
        self._wake.set()
        self._running.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _sleep(self, seconds: float) -> None:
        """Wait `seconds`, or less when woken or stopped (a wake during the round just ended counts)."""
        self._wake.wait(seconds)
        self._wake.clear()

    def _loop(self) -> None:
        self._sleep(self.first_wait)
        while not self._stop.is_set():
            self._running.wait()
            for target in self._targets():
                if self._stop.is_set() or not self._running.is_set():
                    break
                try:
                    self._check(target)
                except Exception as error:  # any failure of a check means the target cannot serve
                    if self._running.is_set():  # a pause began meanwhile: the update restarts engines itself
                        self._report(target, error)
            self._sleep(self.interval)

    def _report(self, target: Any, error: Exception) -> None:
        """Hand a failure to `on_failure`; an error there is logged, and the next round checks again."""
        try:
            self._on_failure(target, error)
        except Exception:
            logger.exception("%s: handling the failure of %s (%s) failed", self._thread.name, target, error)
