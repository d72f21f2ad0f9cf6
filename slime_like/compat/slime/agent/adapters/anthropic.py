"""slime's `AnthropicAdapter`: Anthropic's `/v1/messages` (for agents such as Claude Code) over our endpoint.

A request is translated to an OpenAI chat body (system prompt, text / tool_use / tool_result blocks, tools with
their `input_schema`, `max_tokens`, `stop_sequences`, sampling fields) and the answer back to an Anthropic message
(text and `tool_use` blocks, `stop_reason` `end_turn` / `tool_use` / `max_tokens` / `stop_sequence`), also as
Anthropic's server-sent events when `stream` is true (each block whole, once the turn is generated).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from aiohttp import web
from slime.agent.adapters.common import BaseAdapter, flatten_content

from rollout.openai_session import EndpointError

logger = logging.getLogger(__name__)

_STOP = {"tool_calls": "tool_use", "length": "max_tokens", "stop": "end_turn"}


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
        messages = []
        if body.get("system"):
            messages.append({"role": "system", "content": flatten_content(body["system"])})
        for message in body.get("messages") or []:
            messages += _translate(message)
        chat: dict[str, Any] = {"messages": messages}
        if body.get("tools"):
            chat["tools"] = [_tool(t) for t in body["tools"]]
        for ours, theirs in (("max_tokens", "max_tokens"), ("stop", "stop_sequences"), ("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k")):  # fmt: skip
            if body.get(theirs) is not None:
                chat[ours] = body[theirs]
        choice = body.get("tool_choice") or {}
        if choice.get("type") == "any":
            chat["tool_choice"] = "required"
        elif choice.get("type") == "tool":
            chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
        elif choice.get("type") == "none":
            chat["tool_choice"] = "none"
        return chat


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic tool as an OpenAI function tool."""
    schema = tool.get("input_schema") or {"type": "object", "properties": {}}
    function = {"name": tool["name"], "description": tool.get("description", ""), "parameters": schema}
    return {"type": "function", "function": function}


def _translate(message: dict[str, Any]) -> list[dict[str, Any]]:
    """One Anthropic message as OpenAI chat messages (a user turn's tool results become `tool` messages)."""
    role, content = message.get("role"), message.get("content")
    if isinstance(content, str) or content is None:
        return [{"role": role, "content": content or ""}]
    if role == "assistant":
        text = flatten_content([b for b in content if b.get("type") == "text"])
        calls = [
            {
                "id": b.get("id", ""),
                "type": "function",
                "function": {"name": b["name"], "arguments": json.dumps(b.get("input") or {})},
            }  # fmt: skip
            for b in content
            if b.get("type") == "tool_use"
        ]
        return [{"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}]
    if role != "user":
        raise EndpointError(400, f"message role {role!r}: Anthropic messages are user or assistant")
    out = [
        {"role": "tool", "tool_call_id": b.get("tool_use_id", ""), "content": flatten_content(b.get("content"))}
        for b in content
        if b.get("type") == "tool_result"
    ]
    rest = [b for b in content if b.get("type") != "tool_result"]
    if rest:
        out.append({"role": "user", "content": flatten_content(rest)})
    return out


def _message(body: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """The endpoint's OpenAI answer as an Anthropic message."""
    choice = answer["choices"][0]
    reply = choice["message"]
    blocks: list[dict[str, Any]] = [{"type": "text", "text": reply["content"]}] if reply.get("content") else []
    for call in reply.get("tool_calls") or []:
        try:
            arguments = json.loads(call["function"]["arguments"] or "{}")
        except json.JSONDecodeError:
            arguments = {"_raw_arguments": call["function"]["arguments"]}
        blocks.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": arguments})
    stop = _STOP.get(choice["finish_reason"], "end_turn")
    usage = {"input_tokens": answer["usage"]["prompt_tokens"], "output_tokens": answer["usage"]["completion_tokens"]}
    return {
        "id": f"msg_{answer['id'].split('-')[-1]}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model") or answer["model"],
        "content": blocks,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage,
    }


async def _respond(request: web.Request, body: dict[str, Any], answer: dict[str, Any]) -> web.StreamResponse:
    """The answer as an Anthropic message, or as Anthropic's server-sent events when the client streams."""
    message = _message(body, answer)
    if not body.get("stream"):
        return web.json_response(message)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)

    async def emit(kind: str, data: dict[str, Any]) -> None:
        await response.write(f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode())

    start = {**message, "content": [], "stop_reason": None, "usage": {**message["usage"], "output_tokens": 0}}
    await emit("message_start", {"message": start})
    for i, block in enumerate(message["content"]):
        if block["type"] == "text":
            await emit("content_block_start", {"index": i, "content_block": {"type": "text", "text": ""}})
            await emit("content_block_delta", {"index": i, "delta": {"type": "text_delta", "text": block["text"]}})
        else:
            await emit("content_block_start", {"index": i, "content_block": {**block, "input": {}}})
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            await emit("content_block_delta", {"index": i, "delta": delta})
        await emit("content_block_stop", {"index": i})
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    await emit("message_delta", {"delta": delta, "usage": {"output_tokens": message["usage"]["output_tokens"]}})
    await emit("message_stop", {})
    await response.write_eof()
    return response
