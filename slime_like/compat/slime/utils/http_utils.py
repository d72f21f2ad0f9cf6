"""slime.utils.http_utils: async JSON `post` (retried) and `get` for plugin code.

Inside a rollout they use its HTTP session and hold one of its concurrency slots per request, as slime's
shared client is bounded by --sglang-server-concurrency x servers; outside one, a short-lived session.
A request to the rollout's router or one of its servers carries the run's secret; one to any other URL does not.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp

from rollout.context import current_context
from rollout.generate import with_adapter
from slime_like.core.secret import auth_headers, same_origin

logger = logging.getLogger(__name__)


async def _request(method: str, url: str, payload: Any = None, headers: dict[str, str] | None = None) -> Any:
    ctx = current_context()
    # The run's other models (--sglang-config) are ours too: their routers demand the secret.
    routers = (getattr(ctx.args, "sglang_model_routers", None) or {}) if ctx is not None else {}
    ours = [f"http://{host}:{port}" for host, port in routers.values()]
    if ctx is not None and same_origin(url, [ctx.router_url, *ctx.server_urls, *ours]):
        # slime plugins post to the router by URL; the secret must never reach a third-party endpoint.
        headers = {**auth_headers(), **(headers or {})}
    if ctx is not None and ctx.loop is asyncio.get_running_loop():
        async with ctx.semaphore:
            return await _send(ctx.session, method, url, payload, headers)
    async with aiohttp.ClientSession(trust_env=False) as session:
        return await _send(session, method, url, payload, headers)


async def _send(
    session: aiohttp.ClientSession, method: str, url: str, payload: Any, headers: dict[str, str] | None
) -> Any:
    call = (
        session.post(url, json=payload or {}, headers=headers)
        if method == "POST"
        else session.get(url, headers=headers)
    )
    async with call as resp:
        resp.raise_for_status()
        text = await resp.text()
    try:
        return json.loads(text)
    except ValueError:
        return text


async def post(
    url: str, payload: dict[str, Any] | None, max_retries: int = 60, headers: dict[str, str] | None = None
) -> Any:
    """POST JSON; the JSON answer (its text if not JSON). Any failure is retried after 1 s, `max_retries` tries in all.
    In a LoRA run a /generate names the policy's adapter, as the built-in generate does."""
    ctx = current_context()
    if ctx is not None and url.endswith("/generate") and isinstance(payload, dict):
        payload = with_adapter(ctx.args, payload)
    for attempt in range(1, max_retries + 1):
        try:
            return await _request("POST", url, payload, headers)
        except Exception as exc:  # slime retries whatever went wrong
            if attempt >= max_retries:
                raise
            logger.info("POST %s failed (%r), try %d of %d in 1 s", url, exc, attempt + 1, max_retries)
            await asyncio.sleep(1)
    raise ValueError(f"post: max_retries must be at least 1, got {max_retries}")


async def get(url: str) -> Any:
    """GET and return the parsed JSON answer (no retries)."""
    return await _request("GET", url)


def init_http_client(args: Any) -> None:
    """No-op: requests use the running rollout's session."""


def get_rollout_num_engines(args: Any) -> int:
    """Number of SGLang servers: the running rollout's, else --rollout-num-gpus / --rollout-num-gpus-per-engine."""
    ctx = current_context()
    if ctx is not None:
        return len(ctx.server_urls)
    return max(1, args.rollout_num_gpus // args.rollout_num_gpus_per_engine)
