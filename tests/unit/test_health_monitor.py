"""The health monitor's schedule: checks every target each interval (sooner when woken), reports failures, stays
quiet when paused, survives a failing handler."""

from __future__ import annotations

import threading
import time

import pytest

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


def wait_until(done: object, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.01)
    return bool(done())  # type: ignore[operator]


def test_wake_checks_at_once_and_waits_for_resume_when_paused() -> None:
    # The router's monitor: a failed request wakes it, so a dead router is found long before the interval ends.
    checked: list[float] = []
    monitor = HealthMonitor(lambda: ["router"], lambda t: checked.append(time.monotonic()), lambda t, e: None, 60)
    monitor.start()
    try:
        assert wait_until(lambda: len(checked) == 1)  # the first round, at once
        time.sleep(0.2)
        assert len(checked) == 1  # the next is 60 s away
        woken = time.monotonic()
        monitor.wake()
        assert wait_until(lambda: len(checked) == 2) and checked[1] - woken < 1.0
        monitor.pause()
        monitor.wake()
        time.sleep(0.3)
        assert len(checked) == 2  # paused: the wake waits
        monitor.resume()
        assert wait_until(lambda: len(checked) == 3)
        time.sleep(0.3)
        assert len(checked) == 3  # one wake, one check
    finally:
        monitor.stop()


def test_a_failing_failure_handler_is_logged_and_the_checks_go_on(caplog: pytest.LogCaptureFixture) -> None:
    # A router that cannot be restarted now must be tried again at the next round, not end the thread.
    calls: list[str] = []

    def on_failure(target: str, error: Exception) -> None:
        calls.append(str(error))
        raise RuntimeError("restart failed")

    def check(target: str) -> None:
        raise RuntimeError(f"down {len(calls)}")

    monitor = HealthMonitor(lambda: ["router"], check, on_failure, interval=0.05, name="router-health")
    monitor.start()
    try:
        assert wait_until(lambda: len(calls) >= 3)
    finally:
        monitor.stop()
    assert calls[:3] == ["down 0", "down 1", "down 2"]
    messages = [r.getMessage() for r in caplog.records]
    assert any("router-health: handling the failure of router (down 0) failed" in m for m in messages)


def test_stop_ends_the_first_wait() -> None:
    monitor = HealthMonitor(lambda: ["a"], lambda t: None, lambda t, e: None, interval=60, first_wait=60)
    monitor.start()
    start = time.monotonic()
    monitor.stop()
    assert time.monotonic() - start < 2 and not monitor._thread.is_alive()
