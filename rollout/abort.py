"""Stop what a rollout still has running on the SGLang servers, and wait until it has all come back."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from typing import Any

import aiohttp

from rollout.context import RolloutContext

logger = logging.getLogger(__name__)


async def abort_all_servers(ctx: RolloutContext) -> None:
    """POST /abort_request {abort_all} to every server directly (the router does not reach every worker)."""

    async def one(url: str) -> None:
        try:
            async with ctx.session.post(f"{url}/abort_request", json={"abort_all": True}) as resp:
                if resp.status != 200:
                    logger.warning("%s/abort_request answered %d: %s", url, resp.status, (await resp.text())[:200])
        except (TimeoutError, aiohttp.ClientError) as exc:
            logger.warning("%s/abort_request failed: %r", url, exc)

    await asyncio.gather(*(one(url) for url in ctx.server_urls))
    ctx.count("abort_requests")


async def abort_and_drain(ctx: RolloutContext, tasks: Collection[asyncio.Task[Any]], interval: float = 1.0) -> None:
    """Abort until every task has returned (aborted requests answer with the tokens generated so far).

    The abort is repeated: a request that was on its way when the first abort landed would otherwise run on.
    """
    ctx.aborting = True  # generate functions send nothing new from here on
    try:
        pending = {t for t in tasks if not t.done()}
        while pending:
            await abort_all_servers(ctx)
            _, pending = await asyncio.wait(pending, timeout=interval)
    finally:
        ctx.aborting = False
