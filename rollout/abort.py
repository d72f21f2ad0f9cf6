"""Stop what a rollout still has running on the SGLang servers, and wait until it has all come back."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from typing import Any

from rollout import sglang_client as client
from rollout.context import RolloutContext
from slime_like.core.errors import EngineError

logger = logging.getLogger(__name__)


async def abort_all_servers(ctx: RolloutContext) -> None:
    """POST /abort_request {abort_all} to every server directly (the router does not reach every worker)."""

    async def one(url: str) -> None:
        try:
            await client.abort_request(ctx.session, url)
        except EngineError as exc:
            logger.warning("%s", exc)

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
