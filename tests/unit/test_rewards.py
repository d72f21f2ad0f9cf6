"""Reward hub: boxed extraction, DAPO/DeepScaleR/F1 scorers, math-verify and reasoning-gym in killable workers,
failure accounting of RewardFunction, and the remote reward model against a local HTTP server."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from argparse import Namespace
from collections import Counter
from typing import Any

import pytest
from aiohttp import web

from rollout.reward_threads import RewardThreads
from rollout.rewards import RewardFunction
from rollout.rm_hub.boxed import dapo_reward, deepscaler_reward, last_boxed
from rollout.rm_hub.f1 import f1_reward
from rollout.rm_hub.remote import RemoteRewardModel
from slime_like.core.sample import Sample, Status


def sample(response: str, label: Any = "1", index: int = 0, **kw: Any) -> Sample:
    return Sample(prompt="q", response=response, label=label, index=index, status=Status.COMPLETED, **kw)


def rm_args(**kw: Any) -> Namespace:
    base = dict(
        custom_rm_path=None, group_rm=False, rm_type="math", rm_timeout=5.0, rm_retries=2, rm_num_workers=1,
        rm_url=None, reward_key=None,
    )  # fmt: skip
    return Namespace(**{**base, **kw})


class Counts:
    """The `count` callback a RolloutContext gives, as a Counter."""

    def __init__(self) -> None:
        self.c: Counter[str] = Counter()

    def __call__(self, key: str, n: int = 1) -> None:
        self.c[key] += n


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{\\frac{1}{2}} and", "\\frac{1}{2}"),
        ("\\boxed{1} then \\boxed{{2}+3}", "{2}+3"),
        ("$\\boxed 7$", "7"),
        ("\\fbox{x}", "x"),
        ("\\boxed{cut", None),
        ("no box", None),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


def test_dapo_is_strict_and_signed() -> None:
    assert dapo_reward("work... \\boxed{42}", "42") == 1.0
    assert dapo_reward("\\boxed{41}", "42") == -1.0
    assert dapo_reward("The answer is 42", "42") == -1.0  # no box: wrong under strict boxing
    assert dapo_reward("\\boxed{42}" + " filler" * 60, "42") == -1.0  # only the last 300 characters count
    assert dapo_reward("\\boxed{1,000 dollars}", "1000") == 1.0  # Minerva normalisation


def test_deepscaler_normalises_and_reads_after_think() -> None:
    assert deepscaler_reward("<think>\\boxed{1}</think> so \\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}") == 1.0
    assert deepscaler_reward("<think>\\boxed{3}</think> no box", "3") == 0.0
    assert deepscaler_reward("\\boxed{x = 3.0}", "3") == 1.0
    assert deepscaler_reward("\\boxed{4}", ["3", "4"]) == 1.0
    assert deepscaler_reward("\\boxed{5}", "3") == 0.0


def test_f1_on_short_answers() -> None:
    assert f1_reward("<answer>The Eiffel Tower!</answer>", "eiffel tower") == 1.0
    assert f1_reward("Answer: Paris France", "Paris") == pytest.approx(2 / 3)
    assert f1_reward("\\boxed{blue}", ["red", "blue"]) == 1.0
    assert f1_reward("nothing", "something") == 0.0


def test_raising_and_slow_reward_functions_fail_their_samples_and_are_counted() -> None:
    def raising(args: Any, s: Sample) -> float:
        if s.index == 1:
            raise RuntimeError("boom")
        return {"score": 1.0, "acc": 1.0}  # type: ignore[return-value]

    async def slow(args: Any, s: Sample) -> float:
        await asyncio.sleep(30 if s.index == 0 else 0)
        return 0.5

    counts = Counts()
    group = [sample("a", index=0), sample("b", index=1), sample("c", index=2, metadata={})]
    group[2].status = Status.FAILED  # generation failed: not scored, reward 0
    asyncio.run(RewardFunction(raising, timeout=5).score_group(None, group, counts))
    assert group[0].reward == {"score": 1.0, "acc": 1.0} and group[0].status == Status.COMPLETED
    assert group[1].status == Status.FAILED and group[1].reward == 0.0 and "boom" in group[1].metadata["reward_error"]
    assert group[2].reward == 0.0 and counts.c == {"reward_failed": 1}

    counts = Counts()
    group = [sample("a", index=0), sample("b", index=1)]
    start = time.monotonic()
    asyncio.run(RewardFunction(slow, timeout=0.3).score_group(None, group, counts))
    assert time.monotonic() - start < 5
    assert [s.reward for s in group] == [0.0, 0.5] and group[0].metadata["reward_error"] == "timed out"
    assert counts.c == {"reward_failed": 1, "reward_timeout": 1}


def test_group_reward_is_one_call_and_checked() -> None:
    calls: list[list[int]] = []

    async def per_group(args: Any, group: list[Sample]) -> list[float]:
        calls.append([s.index for s in group])
        return [float(s.index) for s in group]

    group = [sample("a", index=i) for i in range(3)]
    asyncio.run(RewardFunction(per_group, per_group=True, timeout=5).score_group(None, group, Counts()))
    assert calls == [[0, 1, 2]] and [s.reward for s in group] == [0.0, 1.0, 2.0]

    counts = Counts()
    bad = RewardFunction(lambda args, g: [1.0], per_group=True, timeout=5)
    asyncio.run(bad.score_group(None, group, counts))
    assert all(s.status == Status.FAILED for s in group) and counts.c["reward_failed"] == 3
    assert "one reward per sample" in group[0].metadata["reward_error"]


def test_reward_of_the_wrong_type_fails_the_sample() -> None:
    group = [sample("a")]
    counts = Counts()
    asyncio.run(RewardFunction(lambda a, s: "high", timeout=5).score_group(None, group, counts))
    assert group[0].status == Status.FAILED and "number or a dict" in group[0].metadata["reward_error"]


def test_a_plain_reward_that_hangs_times_out_in_its_own_threads(caplog: pytest.LogCaptureFixture) -> None:
    release = threading.Event()
    threads: list[str] = []

    def hangs_on_first(args: Any, s: Sample) -> float:
        threads.append(threading.current_thread().name)
        if s.index == 0:
            release.wait(30)  # a plain function that never returns in time: its thread cannot be stopped
        return 1.0

    fn = RewardFunction(hangs_on_first, timeout=0.3)
    counts = Counts()
    group = [sample("a", index=0), sample("b", index=1)]
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="rollout.rewards"):
        asyncio.run(fn.score_group(None, group, counts))
    try:
        assert time.monotonic() - start < 5
        assert group[0].status == Status.FAILED and group[0].metadata["reward_error"] == "timed out"
        assert group[1].reward == 1.0 and counts.c == {"reward_failed": 1, "reward_timeout": 1}
        # It ran in the scorer's own threads, not the event loop's default executor that other rollout code uses.
        assert all(name.startswith("reward") for name in threads)
        assert "cannot be stopped" in caplog.text and "1 such calls now" in caplog.text
    finally:
        release.set()
        asyncio.run(fn.close())


def test_reward_threads_are_daemons_reused_when_idle_and_close_without_waiting() -> None:
    threads = RewardThreads(2, "rt")
    release = threading.Event()
    try:
        assert threads.submit(lambda: 1).result(5) == 1
        names = [threads.submit(threading.current_thread).result(5) for _ in range(3)]
        assert {t.name for t in names} == {"rt_0"} and all(t.daemon for t in names)  # an idle thread is reused
        stuck = [threads.submit(release.wait) for _ in range(2)]  # both threads now busy
        queued = threads.submit(lambda: "never run")
        time.sleep(0.2)
        assert not queued.done()  # no third thread beyond size
        start = time.monotonic()
        running = threads.close()
        assert time.monotonic() - start < 1 and running == 2
        assert queued.cancelled() and not any(f.done() for f in stuck)
        with pytest.raises(RuntimeError, match="closed"):
            threads.submit(lambda: 1)
    finally:
        release.set()
    assert [f.result(5) for f in stuck] == [True, True]  # a call that was left running still completes


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), {"score": float("-inf")}])
def test_a_non_finite_reward_fails_the_sample(bad: Any) -> None:
    group = [sample("a")]
    counts = Counts()
    asyncio.run(RewardFunction(lambda a, s: bad, inline=True).score_group(None, group, counts))
    assert group[0].status == Status.FAILED and "must be a finite number" in group[0].metadata["reward_error"]
    assert group[0].reward == 0.0 and counts.c == {"reward_failed": 1}


class RewardServer:
    """A local HTTP reward service on 127.0.0.1: `script` lists what each request gets (status or delay)."""

    def __init__(self) -> None:
        self.script: list[Any] = []
        self.requests: list[dict[str, Any]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        action = self.script.pop(0) if self.script else 200
        if isinstance(action, float):
            await asyncio.sleep(action)
        if action == 500:
            return web.Response(status=500, text="overloaded")
        if action == "dict":
            return web.json_response({"reward": {"score": 0.25, "len": 3.0}})
        return web.json_response({"reward": len(body["response"]) / 10})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/score", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/score"

    async def stop(self) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


def test_remote_reward_retries_then_fails_when_the_server_goes_down() -> None:
    async def scenario() -> None:
        server = RewardServer()
        await server.start()
        model = RemoteRewardModel(server.url, timeout=0.5, retries=2, backoff=0.05)
        fn = RewardFunction(model, counters=model.counters, on_close=model.close)
        counts = Counts()
        group = [sample("12345", index=0)]
        server.script = [500, 2.0]  # an error, then an answer past the timeout, then success
        await fn.score_group(None, group, counts)
        assert group[0].reward == 0.5 and len(server.requests) == 3
        assert server.requests[0] == {"prompt": "q", "response": "12345", "label": "1", "metadata": {}, "index": 0}
        assert fn.drain_counters() == {"rm_remote_retries": 2}
        server.script = ["dict"]
        group = [sample("x", index=1)]
        await fn.score_group(None, group, counts)
        assert group[0].reward == {"score": 0.25, "len": 3.0}
        await server.stop()  # the reward service goes down
        group = [sample("x", index=2), sample("y", index=3)]
        await fn.score_group(None, group, counts)
        assert all(s.status == Status.FAILED and "--rm-url" in s.metadata["reward_error"] for s in group)
        assert counts.c == {"reward_failed": 2}
        assert fn.drain_counters() == {"rm_remote_retries": 4, "rm_remote_failures": 2}
        await fn.close()

    asyncio.run(scenario())
