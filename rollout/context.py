"""What generate functions and rollout plugins are handed: arguments, tokenizer, HTTP session, hooks, counters."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import aiohttp


@dataclass
class RolloutRecord:
    """What the built-in rollout loop generated in one rollout (one step with --fully-async), for slime's
    --rollout-all-samples-process-path: every group, dropped ones included, and the buffer they came from."""

    buffer: Any  # buffer.buffer.Buffer
    generated: list[list[Any]] = field(default_factory=list)


@dataclass
class RolloutContext:
    """One rollout's (or eval's) shared state; plugins read it and count events with `count`."""

    args: Any
    tokenizer: Any
    # Read it per request: with --use-fault-tolerance a restarted router may come back on another port, and the
    # manager then updates every open context.
    router_url: str
    session: aiohttp.ClientSession
    semaphore: asyncio.Semaphore  # bounds in-flight /generate requests (--sglang-server-concurrency x servers)
    counters: dict[str, int] = field(default_factory=dict)
    server_urls: list[str] = field(default_factory=list)  # each SGLang server, for aborts
    hooks: Any = None  # rollout.hooks.RolloutHooks: the configured generate and reward functions
    # Set while a rollout aborts what still runs: generate functions send no new request and stop.
    aborting: bool = False
    inflight: set[str] = field(default_factory=set)  # rids of requests sent and not yet answered
    evaluation: bool = False  # an eval, not a training rollout
    rollout_id: int | None = None  # the rollout (or the rollout an eval follows), when a manager runs it
    loop: asyncio.AbstractEventLoop | None = None  # the loop the session belongs to (for code run in threads)
    plugin_state: dict[str, Any] = field(default_factory=dict)  # what plugins keep for this rollout
    # The built-in rollout loop's buffer.accounting.GroupLedger (None in a --rollout-function-path rollout).
    accounting: Any = None
    record: RolloutRecord | None = None  # the built-in rollout loop's (None in a --rollout-function-path rollout)
    # Called (on the event loop, must not block) when a request through the router failed and will be retried: with
    # --use-fault-tolerance it makes the router's health check run now instead of at the end of its interval.
    request_failed: Callable[[], None] | None = None
    engine_turn: int = 0  # round robin over server_urls for requests the router cannot pass on (R3's)

    def count(self, key: str, n: int = 1) -> None:
        """Add to a named counter reported in the rollout metrics as `rollout/<key>`."""
        self.counters[key] = self.counters.get(key, 0) + n


_current: ContextVar[RolloutContext | None] = ContextVar("rollout_context", default=None)


def current_context() -> RolloutContext | None:
    """The context of the rollout (or eval) running in this task or thread, if any."""
    return _current.get()


@contextmanager
def running(ctx: RolloutContext) -> Iterator[RolloutContext]:
    """Make `ctx` the current context (tasks and `asyncio.to_thread` calls started inside inherit it)."""
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)
