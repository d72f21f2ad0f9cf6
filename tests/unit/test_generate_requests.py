"""The default generate function's requests against a scripted local HTTP server standing in for SGLang:
one rid per attempt, the failed attempt aborted by rid before the retry, no request once a rollout aborts."""

from __future__ import annotations

import asyncio
from argparse import Namespace
from typing import Any

import aiohttp
from aiohttp import web

from rollout.context import RolloutContext
from rollout.generate import generate
from slime_like.core.sample import Sample, Status


class FakeSGLang:
    """/generate answers per `script` (a status code, or a finish reason type); /abort_request is recorded."""

    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.generated: list[dict[str, Any]] = []
        self.aborted: list[dict[str, Any]] = []

    async def generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.generated.append(body)
        action = self.script.pop(0) if self.script else "stop"
        if isinstance(action, int):
            return web.Response(status=action, text="restarting")
        message = "Input is longer than the context" if action == "abort" else None
        meta = {
            "output_token_logprobs": [[-0.5, 7, None], [-0.25, 8, None]],
            "finish_reason": {"type": action, "message": message},
            "weight_version": "3",
        }
        return web.json_response({"text": "ab", "meta_info": meta})

    async def abort(self, request: web.Request) -> web.Response:
        self.aborted.append(await request.json())
        return web.Response()


async def run(
    script: list[Any], aborting: bool = False, context_len: int | None = None
) -> tuple[FakeSGLang, Sample, dict[str, int]]:
    fake = FakeSGLang(script)
    app = web.Application()
    app.router.add_post("/generate", fake.generate)
    app.router.add_post("/abort_request", fake.abort)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    sample = Sample(tokens=[1, 2, 3], index=5)
    try:
        async with aiohttp.ClientSession() as session:
            ctx = RolloutContext(
                Namespace(rollout_seed=1, rollout_max_context_len=context_len),
                None,
                url,
                session,
                asyncio.Semaphore(2),
                server_urls=[url],
            )
            ctx.aborting = aborting
            await generate(ctx, sample, {"max_new_tokens": 4, "temperature": 1.0})
    finally:
        await runner.cleanup()
    return fake, sample, ctx.counters


def test_retry_uses_a_new_rid_after_aborting_the_failed_one() -> None:
    fake, sample, counters = asyncio.run(run([503, "length"]))
    rids = [g["rid"] for g in fake.generated]
    base = sample.metadata["rid"]
    assert base.startswith("sample-5-") and rids == [f"{base}-0", f"{base}-1"]
    assert fake.aborted == [{"rid": f"{base}-0"}]  # the failed attempt is stopped, precisely
    assert counters == {"generate_retries": 1}
    assert sample.status == Status.TRUNCATED and sample.tokens == [1, 2, 3, 7, 8]
    assert sample.loss_mask == [1, 1] and sample.rollout_log_probs == [-0.5, -0.25] and sample.weight_version == 3
    assert fake.generated[0]["sampling_params"]["max_new_tokens"] == 4


def test_nothing_is_sent_once_the_rollout_aborts() -> None:
    fake, sample, _ = asyncio.run(run([], aborting=True))
    assert fake.generated == [] and sample.status == Status.ABORTED and sample.response_length == 0


def test_an_abort_the_rollout_did_not_ask_for_is_a_failure() -> None:
    fake, sample, _ = asyncio.run(run(["abort"]))
    assert sample.status == Status.FAILED and "longer than the context" in sample.metadata["generate_error"]


def test_a_client_error_is_not_retried() -> None:
    fake, sample, counters = asyncio.run(run([400]))
    assert len(fake.generated) == 1 and sample.status == Status.FAILED and counters == {}


def test_rollout_max_context_len_caps_new_tokens() -> None:
    # 3 prompt tokens, --rollout-max-context-len 5: at most 2 new tokens although the response budget is 4.
    fake, _, _ = asyncio.run(run(["length"], context_len=5))
    assert fake.generated[0]["sampling_params"]["max_new_tokens"] == 2
