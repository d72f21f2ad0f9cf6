"""A request in flight when the router dies, against scripted local HTTP servers standing in for the router and an
SGLang engine: it fails, wakes the router check, the failed attempt is aborted on the engine by its rid, and the
retry through the restarted router (same port, or a new one) completes the sample with its tokens appended once."""

from __future__ import annotations

import asyncio
from argparse import Namespace

import aiohttp
from aiohttp import web

from rollout.context import RolloutContext
from rollout.generate import generate
from slime_like.core.sample import Sample, Status


class Server:
    """An aiohttp app on 127.0.0.1 that records what it got; `start(port)` binds a given port (a restart)."""

    def __init__(self) -> None:
        self.generated: list[str] = []
        self.aborted: list[str] = []
        self.drop = False  # /generate: close the connection mid-request, as a router that is killed does
        self.runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> None:
        app = web.Application()
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/abort_request", self.abort)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", port)  # SO_REUSEADDR, as the router binds
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    async def generate(self, request: web.Request) -> web.StreamResponse:
        self.generated.append((await request.json())["rid"])
        if self.drop:
            assert request.transport is not None
            request.transport.close()  # the client sees the connection end without an answer
            return web.Response()
        meta = {"output_token_logprobs": [[-0.5, 7, None], [-0.25, 8, None]], "finish_reason": {"type": "stop"}}
        return web.json_response({"text": "ab", "meta_info": meta})

    async def abort(self, request: web.Request) -> web.Response:
        self.aborted.append((await request.json())["rid"])
        return web.Response()


async def run(move: bool) -> tuple[Server, Server, Server, Sample, RolloutContext, int]:
    """One sample through a router that drops it; the wake restarts the router on its port (or on a new one)."""
    engine, router, moved = Server(), Server(), Server()
    await engine.start()
    await router.start()
    router.drop = True
    restarts: list[asyncio.Task[None]] = []
    woken = 0

    async def restart() -> None:  # what the manager does on the health thread (rollout/manager.py)
        await router.stop()
        await asyncio.sleep(0.3)
        if move:
            await moved.start()
            ctx.router_url = moved.url  # the manager updates every open context
        else:
            router.drop = False
            await router.start(router.port)

    def request_failed() -> None:
        nonlocal woken
        woken += 1
        if not restarts:
            restarts.append(asyncio.get_running_loop().create_task(restart()))

    sample = Sample(tokens=[1, 2, 3], index=5)
    try:
        async with aiohttp.ClientSession() as session:
            ctx = RolloutContext(
                Namespace(rollout_seed=1, rollout_max_context_len=None, use_fault_tolerance=True),
                None,
                router.url,
                session,
                asyncio.Semaphore(2),
                server_urls=[engine.url],
                request_failed=request_failed,
            )
            await generate(ctx, sample, {"max_new_tokens": 4, "temperature": 1.0})
            await asyncio.gather(*restarts)
    finally:
        for server in (engine, router, moved):
            await server.stop()
    return engine, router, moved, sample, ctx, woken


def check_sample(sample: Sample) -> None:
    """The two tokens of the one answer, appended once after the prompt."""
    assert sample.status == Status.COMPLETED
    assert sample.tokens == [1, 2, 3, 7, 8] and sample.response == "ab" and sample.response_length == 2
    assert sample.loss_mask == [1, 1] and sample.rollout_log_probs == [-0.5, -0.25]


def test_a_request_cut_off_by_a_dead_router_is_retried_once_it_is_back_on_its_port() -> None:
    engine, router, _, sample, ctx, woken = asyncio.run(run(move=False))
    check_sample(sample)
    base = sample.metadata["rid"]
    first, last = router.generated[0], router.generated[-1]
    assert first == f"{base}-0" and last.startswith(f"{base}-") and last != first
    failed = [f"{base}-{i}" for i in range(int(last.rsplit("-", 1)[1]))]
    # Every failed attempt (cut off, or refused while the router was down) was aborted on the engine by its rid,
    # the last one succeeded, and each failure woke the router check.
    assert engine.aborted == failed and woken == len(failed) == ctx.counters["generate_retries"]


def test_a_router_restarted_on_another_port_gets_the_retry() -> None:
    engine, router, moved, sample, ctx, woken = asyncio.run(run(move=True))
    check_sample(sample)
    base = sample.metadata["rid"]
    assert router.generated == [f"{base}-0"] and len(moved.generated) == 1
    assert ctx.router_url == moved.url and engine.aborted[0] == f"{base}-0" and woken >= 1
