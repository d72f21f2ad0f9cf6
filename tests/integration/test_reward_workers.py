"""Reward scoring in worker processes: math_verify, reasoning-gym and the built-in rm types, timeouts and errors;
a process whose plain-def reward never returns still exits."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from rollout.rewards import get_reward_function
from rollout.rm_hub import gym, math_verify_rm
from rollout.worker_pool import WorkerError, WorkerPool
from tests.unit.test_rewards import Counts, rm_args, sample


def test_math_verify_in_worker_with_boxed_priority() -> None:
    pool = WorkerPool(1, timeout=60)
    try:

        async def score(response: str, label: Any) -> float:
            return await pool.run(math_verify_rm.TARGET, response, label)

        assert asyncio.run(score("We get 1/2 in the end: \\boxed{\\frac{1}{2}}", "0.5")) == 1.0
        # The boxed answer wins over other numbers in the text.
        assert asyncio.run(score("Not 0.5 but \\boxed{\\frac{1}{3}}", "0.5")) == 0.0
        assert asyncio.run(score("no answer here", "2")) == 0.0
    finally:
        pool.close()


def test_worker_timeout_kills_and_replaces_the_worker() -> None:
    pool = WorkerPool(1, timeout=0.5)
    try:
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            asyncio.run(pool.run("time:sleep", 30))  # stands in for a sympy call that never returns
        assert time.monotonic() - start < 10
        assert pool.restarts == 1
        pool.timeout = 30
        assert asyncio.run(pool.run("math:gcd", 12, 18)) == 6  # a fresh worker answers
        with pytest.raises(WorkerError, match="ZeroDivisionError"):
            asyncio.run(pool.run("operator:truediv", 1, 0))
        assert pool.restarts == 1  # a raising function does not cost the worker
    finally:
        pool.close()


def test_reasoning_gym_scorer_in_worker() -> None:
    import reasoning_gym

    entry = reasoning_gym.create_dataset("chain_sum", size=1, seed=5)[0]
    pool = WorkerPool(1, timeout=60)
    try:
        run = lambda response: asyncio.run(  # noqa: E731
            pool.run(gym.TARGET, response, entry["answer"], entry["metadata"], entry["question"])
        )
        assert run(f"<answer>{entry['answer']}</answer>") == 1.0
        assert run(f"<answer>{int(entry['answer']) + 1}</answer>") < 1.0
        assert run("no tags") == 0.0
        with pytest.raises(WorkerError, match="source_dataset"):
            asyncio.run(pool.run(gym.TARGET, "<answer>1</answer>", "1", {}, "q"))
    finally:
        pool.close()


def test_builtin_rm_types_score_samples() -> None:
    async def score(rm_type: str, response: str, label: Any) -> Any:
        fn = get_reward_function(rm_args(rm_type=rm_type))
        group = [sample(response, label)]
        await fn.score_group(rm_args(), group, Counts())
        await fn.close()
        return group[0].reward

    assert asyncio.run(score("dapo", "\\boxed{7}", "7")) == 1.0
    assert asyncio.run(score("deepscaler", "\\boxed{7}", "8")) == 0.0
    assert asyncio.run(score("f1", "<answer>new york</answer>", "New York")) == 1.0
    assert asyncio.run(score("math_verify", "\\boxed{2^{3}}", "8")) == 1.0


HUNG_REWARD = """
import threading

def never_returns(args, sample):
    if sample.index == 0:
        threading.Event().wait()  # a plain-def reward that never returns
    return 1.0
"""

HUNG_RUN = """
import asyncio, json, sys
from argparse import Namespace
from rollout.rewards import get_reward_function
from slime_like.core.sample import Sample, Status

args = Namespace(custom_rm_path="hung_rm.never_returns", group_rm=False, rm_timeout=0.5, plugin_api="auto")
fn = get_reward_function(args)  # as the rollout manager loads --custom-rm-path
group = [Sample(prompt="q", response="2", label="2", index=i, status=Status.COMPLETED) for i in range(2)]
asyncio.run(fn.score_group(args, group, lambda key, n=1: None))
asyncio.run(fn.close())  # what RolloutManager.shutdown does, through RolloutHooks.close
print(json.dumps([[s.status.value, s.reward] for s in group]), flush=True)
"""


def test_a_process_whose_plain_reward_never_returns_exits_promptly(tmp_path: Path) -> None:
    (tmp_path / "hung_rm.py").write_text(HUNG_REWARD)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)])}
    start = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(HUNG_RUN)],
            env=env, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the process did not exit 30 s after its reward call was timed out: {exc.stderr!r}")
    elapsed = time.monotonic() - start
    assert done.returncode == 0, done.stderr
    # The hung call failed its sample after --rm-timeout, the other was scored, and exit did not wait on the thread.
    assert json.loads(done.stdout) == [["failed", 0.0], ["completed", 1.0]]
    assert "reward function never_returns: 1 call(s) still running at shutdown" in done.stderr
    assert elapsed < 20, f"{elapsed:.1f}s"
