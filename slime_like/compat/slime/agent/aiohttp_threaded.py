"""slime's `run_app_in_thread`: serve an aiohttp application from a daemon thread with its own event loop."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_log import AccessLogger

from plugins.agent_sandbox import allow_port


class FilteredAccessLogger(AccessLogger):
    """An access log of the requests worth a look: failed (not 200) or slower than two minutes."""

    SLOW_THRESHOLD_SEC = 120.0

    def log(self, request: Any, response: Any, time: float) -> None:
        """Log the request unless it is a HEAD or a quick 200."""
        if request.method == "HEAD" or (response.status == 200 and time <= self.SLOW_THRESHOLD_SEC):
            return
        super().log(request, response, time)


@dataclass
class AppHandle:
    """A running application: where it listens, its thread and loop."""

    host: str
    port: int
    thread: threading.Thread
    loop: asyncio.AbstractEventLoop
    runner: web.AppRunner

    def stop(self) -> None:
        """Stop serving and end the thread."""
        try:
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout=10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=5)


def run_app_in_thread(
    app: web.Application,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    thread_name: str = "aiohttp-app",
    start_timeout_sec: float = 15.0,
    runner_kwargs: dict[str, Any] | None = None,
) -> AppHandle:
    """Serve `app` on a daemon thread and return once it listens (port 0: a free one). The host defaults to
    127.0.0.1 (slime's is 0.0.0.0): pass the address agents in other machines reach explicitly."""
    started = threading.Event()
    box: dict[str, Any] = {}

    def serve() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            runner = web.AppRunner(app, **(runner_kwargs or {}))
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, host, port)
            loop.run_until_complete(site.start())
            box.update(loop=loop, runner=runner, port=runner.addresses[0][1])
        except BaseException as exc:
            box["error"] = exc
            return
        finally:
            started.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, name=thread_name, daemon=True)
    thread.start()
    if not started.wait(timeout=start_timeout_sec):
        raise TimeoutError(f"{thread_name}: the app did not start listening on {host}:{port} in {start_timeout_sec}s")
    if "error" in box:
        raise box["error"]
    allow_port(int(box["port"]))  # a local sandbox's agent reaches it (plugins/agent_sandbox.py)
    return AppHandle(host, int(box["port"]), thread, box["loop"], box["runner"])
