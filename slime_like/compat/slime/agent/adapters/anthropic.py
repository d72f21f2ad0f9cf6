"""slime's `AnthropicAdapter`: Anthropic's `/v1/messages` (for agents such as Claude Code) over our endpoint.

The translation is the endpoint's own Messages dialect (rollout/anthropic_messages.py): a request becomes an OpenAI
chat body (system prompt, text / tool_use / tool_result blocks, tools with their `input_schema`, `max_tokens`,
`stop_sequences`, sampling fields) and the answer an Anthropic message (text and `tool_use` blocks, `stop_reason`
`end_turn` / `tool_use` / `max_tokens`), also as Anthropic's server-sent events when `stream` is true (each block
whole, once the turn is generated). As in slime, `max_tokens` may be left out (the session's budget applies).
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web
from slime.agent.adapters.common import BaseAdapter

from rollout.anthropic_messages import events, from_chat, to_chat

logger = logging.getLogger(__name__)


class AnthropicAdapter(BaseAdapter):
    """Anthropic Messages over the rollout's endpoint."""

    logger = logger
    log_prefix = "anthropic_adapter"
    max_token_keys = ("max_tokens",)
    stop_keys = ("stop_sequences",)

    def _register_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/messages", self._run_turn)

    async def _run_turn(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/messages."""
        return await self._handle(request, _respond)

    def _to_openai(self, body: dict[str, Any]) -> dict[str, Any]:
        return to_chat(body)


async def _respond(request: web.Request, body: dict[str, Any], answer: dict[str, Any]) -> web.StreamResponse:
    """The answer as an Anthropic message, or as Anthropic's server-sent events when the client streams."""
    message = from_chat(body, answer)
    if not body.get("stream"):
        return web.json_response(message)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for event in events(body, message):
        await response.write(event)
    await response.write_eof()
    return response
