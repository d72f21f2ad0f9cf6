"""slime.utils.async_utils.run: block on a coroutine from plain code (e.g. a plain-def rollout function)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any

from rollout.context import current_context

_background: asyncio.AbstractEventLoop | None = None
_lock = threading.Lock()


def get_async_loop() -> asyncio.AbstractEventLoop:
    """The loop `run` uses: the running rollout's (its HTTP session lives there), else a background thread's."""
    ctx = current_context()
    if ctx is not None and ctx.loop is not None:
        return ctx.loop
    global _background
    with _lock:
        if _background is None:
            _background = asyncio.new_event_loop()
            threading.Thread(target=_background.run_forever, name="slime-async-loop", daemon=True).start()
    return _background


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run `coro` on `get_async_loop()` and wait for its result (call it from a thread, not from that loop)."""
    loop = get_async_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        raise RuntimeError("slime.utils.async_utils.run would block the event loop it needs: await the coroutine")
    return asyncio.run_coroutine_threadsafe(coro, loop).result()
