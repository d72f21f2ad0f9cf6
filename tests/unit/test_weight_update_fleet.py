"""An engine that dies around a weight update (--use-fault-tolerance): the updater asks the fleet, which takes the dead
engine out, and sends again to those left; the fleet's verdict and its rejoin keep a dead engine out of service.

Stand-ins for the transports and the engines' checks; the real run is in tests/integration/test_update_faults.py.
"""

from __future__ import annotations

import logging
from argparse import Namespace

import pytest
import torch

from rollout import fleet as fleet_module
from rollout.engines import Engine
from rollout.fleet import EngineFleet, FleetSpec
from slime_like.core.errors import EngineError, WeightUpdateError
from slime_like.trainer.weights.base import WeightTransport
from slime_like.trainer.weights.updater import WeightUpdater

URLS = ["http://a", "http://b", "http://c"]


class Transport(WeightTransport):
    """Fails while any of its servers is in `dead` (naming it), else records what it sent to whom."""

    def __init__(self, name: str, dead: set[str], log: list) -> None:
        super().__init__(URLS, 1 << 20)
        self.name, self.dead, self.log = name, dead, log

    def update(self, named_tensors, version: int, pause_mode: str = "abort") -> None:
        list(named_tensors)
        down = [url for url in self.server_urls if url in self.dead]
        if down:
            raise WeightUpdateError(f"pause_generation failed: ConnectionError {down[0]}: Connection reset by peer")
        self.log.append((self.name, version, tuple(self.server_urls)))

    def send(self, named_tensors, version: int) -> None:  # pragma: no cover - update is scripted
        raise AssertionError


def export():
    return iter([("w", torch.ones(2))])


def updater(dead: set[str], log: list, verdicts: list, alive: object = None) -> WeightUpdater:
    def fleet(urls: list[str], cause: str) -> list[str]:
        verdicts.append((list(urls), cause))
        if isinstance(alive, Exception):
            raise alive
        return [url for url in urls if url not in dead] if alive is None else list(alive)  # type: ignore[call-overload]

    factories = {kind: (lambda kind=kind: Transport(kind, dead, log)) for kind in ("distributed", "disk")}
    return WeightUpdater(factories, "distributed", "disk", retries=1, fleet=fleet)


def test_a_dead_engine_is_taken_out_and_the_update_reaches_the_others_without_a_retry(caplog) -> None:
    log: list = []
    verdicts: list = []
    up = updater({"http://a"}, log, verdicts)
    with caplog.at_level(logging.WARNING):
        assert up.update(export, 5) == "distributed"  # the primary: no retry spent, no fallback
    assert verdicts == [(URLS, "WeightUpdateError: pause_generation failed: ConnectionError http://a: Connection "
                               "reset by peer")]  # fmt: skip
    assert log == [("distributed", 5, ("http://b", "http://c"))]
    assert up.urls == ["http://b", "http://c"] and up.version == 5
    lines = [r.getMessage() for r in caplog.records if r.name == "slime_like.trainer.weights.updater"]
    assert len(lines) == 1 and "the engine fleet took out http://a after WeightUpdateError" in lines[0], lines
    assert lines[0].endswith("sending to the 2 left")


def test_engines_dying_one_after_the_other_are_each_taken_out() -> None:
    log: list = []
    verdicts: list = []
    dead = {"http://a"}

    class Dying(Transport):
        def update(self, named_tensors, version: int, pause_mode: str = "abort") -> None:
            if self.server_urls == ["http://b", "http://c"]:
                dead.add("http://c")  # dies during the second send
            super().update(named_tensors, version, pause_mode)

    up = updater(dead, log, verdicts)
    up.factories = {kind: (lambda kind=kind: Dying(kind, dead, log)) for kind in ("distributed", "disk")}
    assert up.update(export, 2) == "distributed"
    assert [v[0] for v in verdicts] == [URLS, ["http://b", "http://c"]]
    assert log == [("distributed", 2, ("http://b",))]


def test_no_engine_left_fails_saying_so() -> None:
    log: list = []
    with pytest.raises(WeightUpdateError, match="version 3 failed: no engine of the policy is left .*over distributed"):
        updater(set(URLS), log, []).update(export, 3)
    assert log == []


def test_a_fleet_that_finds_every_engine_alive_leaves_retries_and_fallback_as_they_were(caplog) -> None:
    log: list = []
    verdicts: list = []
    dead = {"http://a"}
    up = updater(dead, log, verdicts, alive=URLS)  # the fleet sees nothing wrong: a failure of the channel
    with pytest.raises(WeightUpdateError, match="distributed: .* \\| distributed: .* \\| disk: "):
        up.update(export, 1)
    assert len(verdicts) == 3 and up.urls is None
    broken = updater(dead, log, [], alive=RuntimeError("manager gone"))  # no verdict: the same
    with caplog.at_level(logging.WARNING), pytest.raises(WeightUpdateError):
        broken.update(export, 1)
    assert any("asking the engine fleet" in r.getMessage() for r in caplog.records)


def test_the_fleet_takes_out_a_dead_engine_and_keeps_it_out_of_the_router(monkeypatch) -> None:
    """The soak's case: engine 0 restarted ("serves after this weight update") and killed before that update."""
    args = Namespace(output_dir="/tmp/unused", rollout_health_check_timeout=5.0)
    fleet = EngineFleet(args, FleetSpec("policy", "model", 1, None))
    fleet.engines = [Engine(i, parts=[], slots=[], url=url) for i, url in enumerate(URLS)]
    fleet.engines[0].joining = True
    fleet._server_urls = list(URLS)
    stopped: list[int] = []
    monkeypatch.setattr(
        fleet_module, "stop_engines", lambda engines, timeout=30, grace=None: stopped.extend(e.index for e in engines)
    )
    monkeypatch.setattr(
        fleet, "_reachable", lambda e: EngineError(f"{e.url}: its SGLang process exited") if e.index == 0 else None
    )
    assert fleet.verdict(URLS, "ConnectionError") == ["http://b", "http://c"]
    assert fleet.engines[0].dead and stopped == [0] and fleet.engine_failures == 1
    assert fleet.live_urls() == ["http://b", "http://c"]
    assert fleet.verdict(["http://b"], "timeout") == ["http://b"]  # checked, alive: not taken out
    assert fleet.rejoin() == 0  # the dead one does not join; recover() restarts it
    assert fleet.engines[0].dead  # out of the router until its restart replaces it


def test_the_weight_check_skips_a_server_the_fleet_took_out(monkeypatch) -> None:
    """Killed after the update tagged its version: the check's probe fails, the fleet takes it out, the check passes."""
    from slime_like.trainer.weights import check

    monkeypatch.setattr(check, "trainer_logprobs", lambda engine, tokens, images=None: torch.zeros(2))

    def served(
        url: str, tokens: list[int], timeout: float = 60.0, lora_path: str | None = None, image_data: object = None
    ) -> torch.Tensor:
        if url == "http://a":
            raise WeightUpdateError("the weight check's probe failed: Connection refused")
        return torch.zeros(2)

    monkeypatch.setattr(check, "served_logprobs", served)
    engine = Namespace(bridge=Namespace(hf_config=Namespace(vocab_size=10)), lora=None)
    asked: list = []
    skipped: list[str] = []
    fleet = lambda urls, cause: asked.append(urls) or []  # noqa: E731
    assert check.check_servers(engine, URLS, 1e-3, 0, "after", fleet=fleet, skipped=skipped) == 0
    assert asked == [["http://a"]] and skipped == ["http://a"]
    with pytest.raises(WeightUpdateError, match="probe failed"):  # the fleet finds it alive: the failure stands
        check.check_servers(engine, URLS, 1e-3, 0, "after", fleet=lambda urls, cause: urls)


def test_a_restarted_engine_joins_only_at_the_current_weight_version(monkeypatch) -> None:
    """Restarted during an update (not among its targets): it stays out at the update's rejoin; one the update reached
    joins; without a source for the current weights (no delta sync) it waits for the next update."""
    args = Namespace(
        output_dir="/tmp/unused", rollout_health_check_timeout=5.0, update_weight_local_checkpoint_dir=None
    )
    fleet = EngineFleet(args, FleetSpec("policy", "model", 1, None))
    fleet.engines = [Engine(i, parts=[], slots=[], url=url) for i, url in enumerate(URLS[:2])]
    joined: list[str] = []

    def join(engines: list[Engine]) -> int:
        for engine in engines:
            engine.joining = False
            joined.append(engine.url)
        return len(engines)

    monkeypatch.setattr(fleet, "_join", join)
    monkeypatch.setattr(fleet, "restart_soon", lambda: None)
    fleet._targets = list(fleet.engines)  # what recover() handed the update
    fleet.engines[0].joining = True  # restarted before the update: the update reached it
    late = Engine(1, parts=[], slots=[], url="http://b2", joining=True)  # restarted while the update ran
    fleet.engines[1] = late
    assert fleet.rejoin(3) == 1 and joined == ["http://a"]
    assert fleet.version == 3 and fleet.engines[0].version == 3 and late.version == 0 and late.joining
    fleet._bring_in()  # no source for version 3 here: it waits for the next update
    assert joined == ["http://a"] and late.joining
    fleet._targets = [fleet.engines[0], late]
    assert fleet.rejoin(4) == 1 and joined == ["http://a", "http://b2"] and late.version == 4


def test_a_restarted_engine_of_a_lora_run_waits_for_the_trainers_adapters(monkeypatch) -> None:
    """A LoRA run's engine restarts with the base only: at version 0 (the base with the trainer's adapters) it is
    behind, stays out of the router and is not caught up from its checkpoint; the next update (which the trainer
    sends with every adapter, as the engine is behind) brings it in."""
    from rollout.catch_up import can_catch_up, checkpoint_version

    args = Namespace(output_dir="/tmp/unused", rollout_health_check_timeout=5.0, lora_rank=4)
    assert checkpoint_version(args) == -1 and not can_catch_up(args, 0)
    assert checkpoint_version(Namespace()) == 0 and can_catch_up(Namespace(), 0)
    fleet = EngineFleet(args, FleetSpec("policy", "model", 1, None))
    fleet.engines = [Engine(0, parts=[], slots=[], url=URLS[0]), Engine(1, parts=[], slots=[], url=URLS[1])]
    joined: list[str] = []
    monkeypatch.setattr(fleet, "_join", lambda engines: joined.extend(e.url for e in engines) or len(engines))
    fleet.engines[1] = Engine(1, parts=[], slots=[], url="http://b2", joining=True, version=checkpoint_version(args))
    assert fleet.version == 0 and fleet.behind() == ["http://b2"]
    fleet._bring_in()
    assert joined == [] and fleet.engines[1].joining
    fleet._targets = list(fleet.engines)
    monkeypatch.setattr(fleet, "restart_soon", lambda: None)
    assert fleet.rejoin(1) == 1 and joined == ["http://b2"] and fleet.behind() == []


def test_a_wait_inside_an_update_ends_when_the_watch_finds_a_target_dead() -> None:
    """A server answer that never comes (a live server held by a broken broadcast): the watch's verdict ends it."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from slime_like.trainer.weights.base import EngineLostError

    transport = Transport("distributed", set(), [])
    polls: list[list[str]] = []
    transport.watch = lambda urls: polls.append(urls) or (["http://c"] if len(polls) > 1 else [])
    release = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        hung = pool.submit(release.wait, 30)
        start = time.monotonic()
        with pytest.raises(EngineLostError, match="http://c died during the broadcast"):
            transport.results([hung], "during the broadcast")
        release.set()
    assert time.monotonic() - start < 5 and len(polls) == 2
