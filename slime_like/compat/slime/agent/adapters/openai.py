"""slime's `OpenAIAdapter`: `/v1/chat/completions` (and streaming) for agents such as the Codex CLI.

The body goes to our endpoint as it is (rollout/openai_endpoint.py: messages with string or text-part content,
tools, tool_choice, sampling fields); the answer is the endpoint's, in OpenAI's format. Beyond slime's adapter it
also serves `/v1/responses` (rollout/openai_responses.py): today's Codex CLI refuses the chat wire API.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web
from slime.agent.adapters.common import BaseAdapter

from rollout import openai_responses
from rollout.openai_chat import ChatStream

logger = logging.getLogger(__name__)


class OpenAIAdapter(BaseAdapter):
    """OpenAI Chat Completions over the rollout's endpoint."""

    logger = logger
    log_prefix = "openai_adapter"
    max_token_keys = ("max_completion_tokens", "max_tokens", "max_output_tokens")
    stop_keys = ("stop",)

    def _register_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._run_turn)
        app.router.add_post("/v1/responses", self._run_response)

    async def _run_turn(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/chat/completions."""
        return await self._handle(request, _respond)

    async def _run_response(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/responses (beyond slime's adapter: today's Codex CLI speaks only this wire API)."""
        return await self._handle(request, _respond_response, handler=openai_responses.handler)

    def _to_openai(self, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("max_output_tokens") is not None and body.get("max_tokens") is None:
            body = {**body, "max_tokens": body["max_output_tokens"]}
        return {k: v for k, v in body.items() if k not in ("metadata", "user", "max_output_tokens")}


async def _respond_response(request: web.Request, body: dict[str, Any], response: dict[str, Any]) -> web.StreamResponse:  # fmt: skip
    """A Responses answer as JSON, or its server-sent events when the client streams."""
    if body.get("stream") is not True:
        return web.json_response(response)
    stream = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await stream.prepare(request)
    for event in openai_responses.events(body, response):
        await stream.write(event)
    await stream.write_eof()
    return stream


async def _respond(request: web.Request, body: dict[str, Any], answer: dict[str, Any]) -> web.StreamResponse:
    """The answer as JSON, or as server-sent events when the client streams."""
    stream = body.get("stream") is True or "text/event-stream" in request.headers.get("Accept", "")
    if not stream:
        return web.json_response(answer)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    stream = ChatStream({**body, "stream_options": {"include_usage": True}}, response.write)
    content = answer["choices"][0]["message"].get("content")
    if content:
        await stream.text(content)
    await stream.finish(answer)
    await response.write_eof()
    return response
