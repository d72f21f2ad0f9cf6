"""Reward functions chosen by `--rm-type` (or `--custom-rm-path`), and safe per-group scoring with timeouts."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import math
import random
import re
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any

from rollout.reward_threads import RewardThreads
from rollout.rm_types import REFUSED_RM_TYPES, RM_TYPE_ALIASES, RM_TYPES
from slime_like.core.sample import Sample, Status

logger = logging.getLogger(__name__)

# Plain-def reward functions run in daemon threads of their own: one that hangs holds its thread (Python cannot stop a
# thread), and must not take the event loop's default executor, which other rollout code shares, down with it, nor
# keep the process alive at exit (rollout/reward_threads.py).
REWARD_THREADS = 32

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def extract_answer(text: str) -> str | None:
    """The final answer: the last \\boxed{...}, else the text after the last 'Answer:', else the last number."""
    boxed = _BOXED.findall(text)
    if boxed:
        return boxed[-1].strip()
    if "Answer:" in text:
        tail = text.rsplit("Answer:", 1)[1]
        numbers = _NUMBER.findall(tail)
        return numbers[0] if numbers else tail.strip() or None
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def _same_answer(answer: str, label: Any) -> bool:
    try:
        return abs(float(answer) - float(label)) < 1e-6
    except (TypeError, ValueError):
        return answer.strip() == str(label).strip()


def math_reward(sample: Sample) -> float:
    """1.0 when the extracted final answer equals the label (numerically when both are numbers)."""
    answer = extract_answer(sample.response)
    return 1.0 if answer is not None and _same_answer(answer, sample.label) else 0.0


def exact_match_reward(sample: Sample) -> float:
    """1.0 when the stripped response equals the stripped label."""
    return 1.0 if sample.response.strip() == str(sample.label).strip() else 0.0


def _is_async(fn: Callable[..., Any]) -> bool:
    # An object with an `async def __call__` (e.g. the remote reward model) counts as async too.
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


class RewardFunction:
    """Scores a group with a per-sample or per-group function; a call that raises or times out fails its samples."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        per_group: bool = False,
        timeout: float | None = None,
        inline: bool = False,
        counters: Counter[str] | None = None,
        on_close: Callable[[], Any] | None = None,
        check: Callable[[Any], Any] | None = None,
    ) -> None:
        self.fn = fn
        self.check = check or _check  # what a valid reward is (slime's contract allows any dict entries)
        self.per_group = per_group
        self.timeout = timeout  # None: the function enforces its own (worker pool, HTTP attempts)
        self.inline = inline  # cheap built-ins run on the loop; user code runs in a thread so it cannot block it
        self.counters = counters if counters is not None else Counter()
        self._on_close = on_close
        self._threads: RewardThreads | None = None
        self._stuck: set[Future[Any]] = set()  # calls still running in a thread after their timeout
        # A built-in --rm-type's: a sample's metadata["rm_type"] picks another built-in (slime's async_rm).
        self.by_type: SampleTypes | None = None

    async def compute(self, args: Any, item: Any) -> Any:
        """The function's raw answer for one sample (or one group with --group-rm); raises what it raises."""
        return await self._call(args, item)

    async def _call(self, args: Any, item: Any) -> Any:
        other = self.by_type.pick(item) if self.by_type is not None else None
        if other is not None:
            return await other._call(args, item)
        if _is_async(self.fn):
            call: Awaitable[Any] = self.fn(args, item)
        elif self.inline:
            return self.fn(args, item)
        else:
            call = self._in_thread(args, item)
        result = await (asyncio.wait_for(call, self.timeout) if self.timeout else call)
        return await result if inspect.isawaitable(result) else result

    async def _in_thread(self, args: Any, item: Any) -> Any:
        """Run a plain-def function in this scorer's threads (with the caller's context variables, as to_thread)."""
        if self._threads is None:
            self._threads = RewardThreads(REWARD_THREADS, "reward")
        future = self._threads.submit(functools.partial(contextvars.copy_context().run, self.fn, args, item))
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if future.running():  # timed out (or the rollout ended): the thread runs on, it cannot be stopped
                self._stuck.add(future)
                future.add_done_callback(self._stuck.discard)
                logger.warning(
                    "reward function %s still running after --rm-timeout %ss: a plain-def function cannot be "
                    "stopped, so it holds one of %d reward threads until it returns (%d such calls now); make it "
                    "async, or bound its own time",
                    self.name,
                    self.timeout,
                    REWARD_THREADS,
                    len(self._stuck),
                )
            raise

    async def score_group(
        self, args: Any, group: list[Sample], count: Callable[[str, int], None], *, keep_set: bool = False
    ) -> None:
        """Set `reward` on every sample of the group whose generation did not fail.

        keep_set: samples whose reward is already set keep it (slime: a generate function may score its samples).
        """
        usable = [s for s in group if s.status != Status.FAILED and not (keep_set and s.reward is not None)]
        for s in group:
            if s.status == Status.FAILED:
                s.reward = 0.0
        if not usable:
            return
        if self.per_group:
            try:
                rewards = await self._call(args, usable)
                if not isinstance(rewards, list | tuple) or len(rewards) != len(usable):
                    raise TypeError(f"--group-rm function must return one reward per sample ({len(usable)})")
                checked = [_finite(self.check(reward)) for reward in rewards]  # all or none: one call
                for sample, reward in zip(usable, checked, strict=True):
                    sample.reward = reward
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the user's reward code may raise anything; the run must go on
                for sample in usable:
                    _fail(sample, exc, count)
            return
        await asyncio.gather(*(self._score_one(args, s, count) for s in usable))

    async def _score_one(self, args: Any, sample: Sample, count: Callable[[str, int], None]) -> None:
        try:
            sample.reward = _finite(self.check(await self._call(args, sample)))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the user's reward code may raise anything; the run must go on
            _fail(sample, exc, count)

    def drain_counters(self) -> dict[str, int]:
        """Counts the reward backend kept itself (e.g. remote retries) since the last call."""
        out = dict(self.counters)
        self.counters.clear()
        return out

    @property
    def name(self) -> str:
        """The reward function's name, for messages."""
        return getattr(self.fn, "__name__", None) or repr(self.fn)

    async def close(self) -> None:
        """Release the backend (HTTP session, worker processes, reward threads); never waits on a stuck call."""
        if self._threads is not None:
            running = self._threads.close()  # a hung call's thread cannot be joined, and nothing joins it
            if running:
                logger.warning(
                    "reward function %s: %d call(s) still running at shutdown (%d past --rm-timeout %ss); not "
                    "waited for, their daemon threads end with the process",
                    self.name,
                    running,
                    len(self._stuck),
                    self.timeout,
                )
            self._threads = None
        if self.by_type is not None:
            await self.by_type.close()
        if self._on_close is not None:
            result = self._on_close()
            if inspect.isawaitable(result):
                await result


def _check(reward: Any) -> float | dict[str, float]:
    """A reward must be a number or a dict of numbers."""
    if isinstance(reward, dict):
        return {str(k): float(v) for k, v in reward.items()}
    if isinstance(reward, int | float):
        return float(reward)
    raise TypeError(f"a reward must be a number or a dict of numbers, got {type(reward).__name__}: {reward!r}")


def _finite(reward: Any) -> Any:
    """A NaN or infinite reward (or dict entry) would poison the group's advantages and the loss: refuse it."""
    values = reward.values() if isinstance(reward, dict) else [reward]
    for value in values:
        if isinstance(value, float | int) and not isinstance(value, bool) and not math.isfinite(value):
            raise ValueError(f"a reward must be a finite number, got {reward!r}")
    return reward


def _fail(sample: Sample, exc: BaseException, count: Callable[[str, int], None]) -> None:
    """Mark a sample whose reward could not be computed: failed, reward 0, counted."""
    timed_out = isinstance(exc, TimeoutError)
    logger.warning("reward for sample %s %s: %r", sample.index, "timed out" if timed_out else "failed", exc)
    sample.reward = 0.0
    sample.status = Status.FAILED
    sample.metadata["reward_error"] = "timed out" if timed_out and not str(exc) else repr(exc)
    count("reward_failed", 1)
    if timed_out:
        count("reward_timeout", 1)


def _pooled(target: str, args: Any, *fields: str) -> RewardFunction:
    """A scorer that runs in killable worker processes (math-verify, reasoning-gym)."""
    from rollout.worker_pool import WorkerPool

    pool = WorkerPool(args.rm_num_workers, timeout=args.rm_timeout)

    async def score(_args: Any, sample: Sample) -> float:
        extra = {"metadata": sample.metadata, "question": sample.prompt}
        return await pool.run(target, sample.response, sample.label, *(extra[f] for f in fields))

    return RewardFunction(score, on_close=pool.close)


def random_reward(sample: Sample) -> float:
    """slime's `random`: 0 or 1 at random (Python's `random` module), whatever the response."""
    return float(random.randint(0, 1))


def boxed_reward(name: str) -> Callable[[Sample], float]:
    """slime's `boxed_<name>`: `name` scores the content of the last \\boxed{} of the response ("" without one)."""
    from rollout.rm_hub import f1, gpqa
    from rollout.rm_hub.boxed import last_boxed

    def score(sample: Sample) -> float:
        answer = last_boxed(sample.response)
        if name == "math":  # the math grader on the box's content as the answer (slime's grades it as a solution)
            return 1.0 if answer is not None and _same_answer(answer, sample.label) else 0.0
        if name == "exact":
            return 1.0 if (answer or "").strip() == str(sample.label).strip() else 0.0
        if name == "f1":
            return f1.f1_reward(answer or "", sample.label)
        return gpqa.gpqa_reward(answer or "", sample.label, sample.metadata)

    return score


def _builtin(name: str, args: Any) -> RewardFunction:
    """The built-in reward of `--rm-type name`."""
    from rollout.rm_hub import boxed, f1, gpqa, gym, math_verify_rm

    plain: dict[str, Callable[[str, Any], float]] = {
        "dapo": boxed.dapo_reward,
        "deepscaler": boxed.deepscaler_reward,
        "f1": f1.f1_reward,
    }
    if name.startswith("boxed_"):
        scorer = boxed_reward(name.removeprefix("boxed_"))
        return RewardFunction(lambda _a, s: scorer(s), inline=True)
    if name == "gpqa":
        return RewardFunction(lambda _a, s: gpqa.gpqa_reward(s.response, s.label, s.metadata), inline=True)
    if name == "random":
        return RewardFunction(lambda _a, s: random_reward(s), inline=True)
    if name == "math":
        return RewardFunction(lambda _a, s: math_reward(s), inline=True)
    if name == "exact":
        return RewardFunction(lambda _a, s: exact_match_reward(s), inline=True)
    if name in plain:
        return RewardFunction(lambda _a, s: plain[name](s.response, s.label), inline=True)
    if name == "math_verify":
        return _pooled(math_verify_rm.TARGET, args)
    if name == "reasoning_gym":
        return _pooled(gym.TARGET, args, "metadata", "question")
    if name == "remote":
        from rollout.rm_hub.remote import RemoteRewardModel

        model = RemoteRewardModel(args.rm_url, args.rm_timeout, args.rm_retries)
        return RewardFunction(model, counters=model.counters, on_close=model.close)
    raise ValueError(f"--rm-type {name!r} is not known")


def get_reward_function(args: Any) -> RewardFunction:
    """The run's reward: the `--custom-rm-path` plugin (per group with --group-rm), else `--rm-type`."""
    if args.custom_rm_path:
        from slime_like.core.plugin_loader import load_hook

        api = getattr(args, "plugin_api", "auto")
        fn, contract = load_hook(args.custom_rm_path, "--custom-rm-path", api, (2, None), (2, None))
        if contract == "slime":
            from rollout.slime_contract import check_reward, reward_hook

            return RewardFunction(
                reward_hook(fn),
                per_group=args.group_rm,
                timeout=args.rm_timeout,
                check=lambda reward: check_reward(reward, args.reward_key),
            )
        return RewardFunction(fn, per_group=args.group_rm, timeout=args.rm_timeout)
    reward = _builtin(args.rm_type, args)
    reward.by_type = SampleTypes(args.rm_type, args)
    return reward


class SampleTypes:
    """The built-ins a sample's metadata["rm_type"] names when it is not --rm-type (slime's async_rm reads the
    sample's first), each made once; an unknown or refused one fails that sample, naming it."""

    def __init__(self, default: str, args: Any) -> None:
        self.default = default
        self.args = args
        self.made: dict[str, RewardFunction] = {}

    def pick(self, item: Any) -> RewardFunction | None:
        """The reward of the sample's own rm_type (None: --rm-type's, or not a sample)."""
        metadata = getattr(item, "metadata", None)
        name = metadata.get("rm_type") if isinstance(metadata, dict) else None
        name = RM_TYPE_ALIASES.get(name, name) if isinstance(name, str) else None
        if not name or name == self.default:
            return None
        if name not in self.made:
            if name in REFUSED_RM_TYPES:
                raise ValueError(f"metadata rm_type {name!r} is not supported here: {REFUSED_RM_TYPES[name]}")
            if name not in RM_TYPES:
                raise ValueError(f"metadata rm_type {name!r} is not a built-in reward here ({', '.join(RM_TYPES)})")
            self.made[name] = _builtin(name, self.args)
        return self.made[name]

    async def close(self) -> None:
        """Close the rewards made."""
        for reward in self.made.values():
            await reward.close()
