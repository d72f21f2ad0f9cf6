"""The health monitor's schedule: checks every live engine each interval, reports failures, stays quiet when paused."""

from __future__ import annotations

import threading
import time

from rollout.health import HealthMonitor


def test_failures_are_reported_and_pauses_respected() -> None:
    live = ["a", "b"]
    checked: list[str] = []
    failed: list[tuple[str, str]] = []
    reported = threading.Event()

    def check(engine: str) -> None:
        checked.append(engine)
        if engine == "b":
            raise RuntimeError("no answer")

    def on_failure(engine: str, error: Exception) -> None:
        failed.append((engine, str(error)))
        live.remove(engine)  # as the manager does: a failed engine is no longer checked
        reported.set()

    monitor = HealthMonitor(lambda: list(live), check, on_failure, interval=0.05)
    monitor.start()
    try:
        assert reported.wait(5)
        assert failed == [("b", "no answer")]
        monitor.pause()
        time.sleep(0.2)  # a round in progress finishes
        before = len(checked)
        time.sleep(0.3)
        assert len(checked) == before  # paused: nothing checked
        monitor.resume()
        deadline = time.monotonic() + 5
        while len(checked) == before and time.monotonic() < deadline:
            time.sleep(0.02)
        assert checked[before:] and set(checked[before:]) == {"a"}
    finally:
        monitor.stop()
    assert failed == [("b", "no answer")]  # reported once


def test_the_first_wait_delays_the_first_check() -> None:
    checked: list[float] = []
    start = time.monotonic()
    monitor = HealthMonitor(lambda: ["a"], lambda e: checked.append(time.monotonic()), lambda e, x: None, 10, 0.3)
    monitor.start()
    try:
        deadline = time.monotonic() + 5
        while not checked and time.monotonic() < deadline:
            time.sleep(0.02)
        assert checked and checked[0] - start >= 0.3
    finally:
        monitor.stop()
