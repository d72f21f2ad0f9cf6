"""OpenAI's Chat Completions and Completions on the agents' endpoint (rollout/openai_endpoint.py).

`/v1/chat/completions`: the messages are rendered with the chat template (tools included) and generated on the
branch of the session they continue; `tools` are parsed from the model's output into `tool_calls` by SGLang's parser
named by `--sglang-tool-call-parser` (the servers' own flag); the sampled ids stay what trains. `/v1/completions`
continues text the same way (each prompt is the text so far). Message `content` may be a string or a list of text
parts (joined with newlines, as slime's adapters do), with image parts for a vision-language model
(rollout/openai_images.py); file parts are refused (400). Not yet: `n > 1`.

Streaming (`stream: true`, every dialect): SGLang streams the turn and its text goes out as it comes (`TextFeed`),
held back only where it may still turn out to be the EOS token, a stop string or the start of a tool call; tool calls
are sent whole when the turn ends. A dialect's stream is any object with `async text(delta)` and `async
finish(answer)` (answer: the Chat Completions answer), made by its `make_stream(body, emit, model)`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from rollout.arguments import server_arg
from rollout.openai_images import IMAGE_PARTS, image_ref, message_images
from rollout.openai_session import Conversation, EndpointError, render

Emit = Callable[[bytes], Awaitable[None]]


def chat_prompt(tokenizer: Any, body: dict[str, Any]) -> str:
    """The chat template's text a chat request asks to continue (messages, tools, generation prompt)."""
    return render(tokenizer, plain_messages(_messages(body)), True, body.get("tools") or None)


async def complete_chat(endpoint: Any, conv: Conversation, body: dict[str, Any], stream: Any = None) -> dict[str, Any]:
    """Generate one assistant turn on the branch the messages continue: the answer in Chat Completions' format (its
    text sent to `stream` as it is generated, if given)."""
    messages = plain_messages(_messages(body))
    images = message_images(messages)
    tools = body.get("tools") or None
    parser = tool_parser(endpoint.ctx.args, tools, body.get("tool_choice"))
    tokenizer = endpoint.ctx.tokenizer
    forced = tool_constraint(parser, body.get("tool_choice"), tokenizer) if parser is not None else {}
    prompt_text = render(tokenizer, messages, generation_prompt=True, tools=tools)
    feed = TextFeed(tokenizer, stream, body, parser) if stream is not None else None
    branch = endpoint.branch_for(conv, prompt_text, images)
    async with branch.lock:  # taken at once: the route chose a branch with no turn in flight
        turn = await endpoint.generate(branch, prompt_text, body, forced, feed.add if feed else None, images)
        reason = turn.reason
        content = _content(tokenizer, turn.ids, turn.text, reason)
        reply: dict[str, Any] = {"role": "assistant", "content": content}
        finish = "length" if reason["type"] == "length" else "stop"
        calls = parser.parse_non_stream(content)[1] if parser is not None and parser.has_tool_call(content) else []
        if calls:
            reply["content"] = parser.parse_non_stream(content)[0] or None
            reply["tool_calls"] = [_tool_call(call) for call in calls]
            finish = "tool_calls"
        # Rendered before the branch keeps the turn: a template that cannot show it leaves the branch as it was.
        shown = render(tokenizer, [*messages, *plain_messages([reply])], False, tools)
        endpoint.keep(conv, branch, turn, shown)
        if calls:
            branch.turns[-1].tool_calls = len(calls)
            endpoint.ctx.count("openai_tool_calls", len(calls))
    input_ids, ids = turn.input_ids, turn.ids
    answer = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model") or endpoint.model_name(),
        "choices": [
            {
                "index": 0,
                "message": reply,
                "finish_reason": finish,
                "logprobs": None,
                "matched_stop": reason.get("matched"),
            }
        ],  # fmt: skip
        "usage": usage(input_ids, ids),
    }
    if feed is not None:
        await feed.finish(reply["content"] or "", answer)
    return answer


async def complete_text(endpoint: Any, conv: Conversation, body: dict[str, Any], stream: Any = None) -> dict[str, Any]:
    """Continue the session's text (`prompt` is the text so far): the answer in Completions' format (its text sent
    to `stream` as it is generated, if given)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise EndpointError(400, "`prompt` must be one non-empty string (token-id prompts: use /generate)")
    if body.get("echo") or body.get("suffix") or body.get("best_of", 1) != 1:
        raise EndpointError(400, "`echo`, `suffix` and `best_of` are not supported by this endpoint")
    feed = TextFeed(endpoint.ctx.tokenizer, stream, body, None) if stream is not None else None
    branch = endpoint.branch_for(conv, prompt)
    async with branch.lock:
        turn = await endpoint.generate(branch, prompt, body, None, feed.add if feed else None)
        text = _content(endpoint.ctx.tokenizer, turn.ids, turn.text, turn.reason)
        # The client goes on from the text it was shown (without the EOS or stop string that ended it).
        endpoint.keep(conv, branch, turn, prompt + text, bridge="")
    input_ids, ids, reason = turn.input_ids, turn.ids, turn.reason
    answer = {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": body.get("model") or endpoint.model_name(),
        "choices": [
            {
                "index": 0,
                "text": text,
                "finish_reason": "length" if reason.get("type") == "length" else "stop",
                "logprobs": None,
            }
        ],
        "usage": usage(input_ids, ids),
    }
    if feed is not None:
        await feed.finish(text, answer)
    return answer


def tool_parser(args: Any, tools: Any, tool_choice: Any) -> Any:
    """SGLang's parser of the model's tool-call format for these tools (None: no tools, or tool_choice none)."""
    if not tools or tool_choice == "none":
        return None
    name = server_arg(args, "--tool-call-parser")
    if name is None:
        raise EndpointError(
            400, "`tools` need the model's tool-call format: start the run with --sglang-tool-call-parser NAME"
        )
    from sglang.srt.entrypoints.openai.protocol import Tool
    from sglang.srt.function_call.function_call_parser import FunctionCallParser

    try:
        return FunctionCallParser([Tool(**t) for t in tools], name)
    except (TypeError, ValueError) as exc:
        raise EndpointError(400, f"`tools` or --sglang-tool-call-parser {name!r}: {exc}") from exc


def tool_constraint(parser: Any, tool_choice: Any, tokenizer: Any) -> dict[str, str]:
    """The grammar SGLang's parser gives for tool_choice "required" or a named function (none for auto); a 400
    naming the cause when the model's tool-call tag is not one special token of the tokenizer, which the model's
    own grammar (a structural tag) needs: SGLang's grammar compiler would refuse it."""
    if tool_choice in (None, "auto", "none"):
        return {}
    from sglang.srt.entrypoints.openai.protocol import ToolChoice

    try:
        choice = tool_choice if tool_choice == "required" else ToolChoice(**tool_choice)
        constraint = parser.get_structure_constraint(choice)
    except (TypeError, ValueError) as exc:
        raise EndpointError(400, f"`tool_choice` {tool_choice!r}: {exc}") from exc
    if constraint is None:
        raise EndpointError(400, f"`tool_choice` {tool_choice!r}: this tool-call parser cannot force a call")
    kind, value = constraint
    # SGLang 0.5.15's grammar compiler reads a structural tag's triggers as special tokens.
    triggers = getattr(value, "triggers", None) or [getattr(parser.detector, "bot_token", "").strip()]
    special = set(getattr(tokenizer, "all_special_tokens", [])) | set(tokenizer.get_added_vocab())
    missing = [t for t in triggers if kind == "structural_tag" and t and t not in special]
    if missing:
        pieces = len(tokenizer(missing[0], add_special_tokens=False)["input_ids"])
        raise EndpointError(
            400,
            f"`tool_choice` {tool_choice!r} cannot be forced with this tokenizer: the tool-call grammar needs the tag "
            f"{missing[0]!r} to be one special token, and this tokenizer splits it into {pieces} tokens. Use "
            "tool_choice auto (or force the call's text with a `regex` in extra_body), or a checkpoint whose "
            "tokenizer has the tag as a special token",
        )
    value = value.model_dump(by_alias=True) if hasattr(value, "model_dump") else value
    return {kind: value if isinstance(value, str) else json.dumps(value)}


def _messages(body: dict[str, Any]) -> list[Any]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise EndpointError(400, "`messages` must be a non-empty list")
    return messages


def plain_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """Messages with string content, as chat templates concatenate it: a list of text parts is joined with
    newlines (as slime's adapters do), a missing content is empty; with image parts the list is kept, text parts
    and image parts (their reference kept in "image": openai_images.py); other parts (files) are refused. A tool
    call's JSON `arguments` become a mapping, as SGLang's own chat server renders them (GLM's templates iterate
    them)."""
    plain = []
    for m in messages:
        if not isinstance(m, dict):
            raise EndpointError(400, "each message must be a JSON object")
        content = m.get("content") or ""
        if isinstance(content, list):
            kinds = {p.get("type") if isinstance(p, dict) else type(p).__name__ for p in content} - {"text"}
            if kinds - IMAGE_PARTS:
                refused = sorted(map(str, kinds - IMAGE_PARTS))
                raise EndpointError(400, f"content parts {refused} are not supported: text and images only")
            if kinds:  # images: the template renders each part (an image as the model's vision block)
                content = [
                    {"type": "image", "image": image_ref(p)} if p.get("type") in IMAGE_PARTS else p for p in content
                ]
            else:
                content = "\n".join(p.get("text") or "" for p in content)
        message = {**m, "content": content}
        if isinstance(m.get("tool_calls"), list):
            message["tool_calls"] = [_with_mapping_arguments(call) for call in m["tool_calls"]]
        plain.append(message)
    return plain


def _with_mapping_arguments(call: Any) -> Any:
    """A tool call whose `function.arguments` JSON object string is parsed (anything else is left as it is)."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        return call
    return {**call, "function": {**function, "arguments": arguments}} if isinstance(arguments, dict) else call


def _tool_call(call: Any) -> dict[str, Any]:
    """One parsed call (SGLang's ToolCallItem) in OpenAI's format."""
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": call.name, "arguments": call.parameters}}  # fmt: skip


def usage(input_ids: list[int], ids: list[int]) -> dict[str, int]:
    """OpenAI's token counts of one turn."""
    return {"prompt_tokens": len(input_ids), "completion_tokens": len(ids), "total_tokens": len(input_ids) + len(ids)}


class TextFeed:
    """A turn's sampled ids as they come -> its text, sent to a stream as soon as it is surely part of the reply."""

    def __init__(self, tokenizer: Any, stream: Any, body: dict[str, Any], parser: Any) -> None:
        self.tokenizer, self.stream, self.ids, self.sent = tokenizer, stream, [], ""
        self.text, self.prefix, self.read = "", 0, 0  # the text of ids[:read]; ids[prefix:read] the decode's context
        stop = body.get("stop") or []
        # Text that may still become a stop string or the start of a tool call is held back until it cannot.
        self.marker = getattr(getattr(parser, "detector", None), "bot_token", "") if parser is not None else ""
        self.hold = max([len(t) for t in ([stop] if isinstance(stop, str) else stop)] + [len(self.marker), 0])

    async def add(self, ids: list[int]) -> None:
        """New sampled ids: send the text that is now safe to show."""
        self.ids += ids
        end = len(self.ids) - 1  # the last id may be the EOS
        if end > self.read:
            # Only the new ids are decoded, behind the previous few for context (a turn's whole text each time would
            # cost its length squared on the rollout's loop).
            before = self.tokenizer.decode(self.ids[self.prefix : self.read], skip_special_tokens=False)
            after = self.tokenizer.decode(self.ids[self.prefix : end], skip_special_tokens=False)
            if len(after) > len(before) and not after.endswith("\ufffd"):  # not inside a multi-byte character
                self.text += after[len(before) :]
                self.prefix, self.read = self.read, end
        text = self.text
        if self.marker and self.marker in text:
            text = text[: text.index(self.marker)]
        text = text[: max(len(self.sent), len(text) - self.hold)]
        if len(text) > len(self.sent) and text.startswith(self.sent):
            delta, self.sent = text[len(self.sent) :], text
            await self.stream.text(delta)

    async def finish(self, content: str, answer: dict[str, Any]) -> None:
        """The turn is over: send the rest of its shown text (`content`), then the stream's closing events."""
        if content.startswith(self.sent) and len(content) > len(self.sent):
            await self.stream.text(content[len(self.sent) :])
            self.sent = content
        await self.stream.finish(answer)


class EventStream:
    """A dialect's server-sent events, made by its `on_text(delta)` and `on_finish(answer)` and sent through `emit`."""

    emit: Emit | None

    def on_text(self, delta: str) -> list[bytes]:
        """The events of a piece of the reply's text."""
        raise NotImplementedError

    def on_finish(self, answer: dict[str, Any]) -> list[bytes]:
        """The events that end the answer (the dialect's own answer)."""
        raise NotImplementedError

    async def text(self, delta: str) -> None:
        """Send a piece of the reply's text."""
        await self._send(self.on_text(delta))

    async def finish(self, answer: dict[str, Any]) -> None:
        """Send the rest of the finished answer and its last events."""
        await self._send(self.on_finish(answer))

    async def _send(self, events: list[bytes]) -> None:
        assert self.emit is not None
        for event in events:
            await self.emit(event)


def make_stream(body: dict[str, Any], emit: Emit, model: str) -> ChatStream:
    """The Chat Completions / Completions stream of a call that asked for one."""
    return ChatStream(body, emit)


class ChatStream:
    """OpenAI's server-sent events for a chat or text completion: the role and each text delta as they come, then
    the tool calls, the finish reason, the usage when asked (`stream_options.include_usage`), and [DONE]."""

    def __init__(self, body: dict[str, Any], emit: Emit) -> None:
        self.emit, self.chat = emit, "messages" in body
        self.include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self.head: dict[str, Any] = {
            "id": f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": int(time.time()),
            "model": body.get("model") or "",
        }
        self.started = False

    async def _send(self, choice: dict[str, Any] | None, **extra: Any) -> None:
        event = {**self.head, "choices": [] if choice is None else [{"index": 0, **choice}], **extra}
        await self.emit(f"data: {json.dumps(event)}\n\n".encode())

    async def text(self, delta: str) -> None:
        """A piece of the reply's text."""
        if not self.chat:
            await self._send({"text": delta, "finish_reason": None})
            return
        await self._send({"delta": {"content": delta} if self.started else {"role": "assistant", "content": delta}, "finish_reason": None})  # fmt: skip
        self.started = True

    async def finish(self, answer: dict[str, Any]) -> None:
        """The turn's end: tool calls, finish reason, usage, [DONE]."""
        self.head["model"] = self.head["model"] or answer["model"]
        choice = answer["choices"][0]
        calls = choice.get("message", {}).get("tool_calls")
        if self.chat and (calls or not self.started):
            delta: dict[str, Any] = {} if self.started else {"role": "assistant", "content": None}
            if calls:
                delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
            await self._send({"delta": delta, "finish_reason": None})
        end = {"delta": {}} if self.chat else {"text": ""}
        await self._send({**end, "finish_reason": choice["finish_reason"]})
        if self.include_usage:
            await self._send(None, usage=answer["usage"])
        await self.emit(b"data: [DONE]\n\n")


def _content(tokenizer: Any, ids: list[int], output_text: str, reason: dict[str, Any]) -> str:
    """The reply's text as OpenAI shows it: without the EOS token or stop string that ended it."""
    matched = reason.get("matched")
    if reason.get("type") != "stop" or not ids:
        return output_text
    if isinstance(matched, int) or (matched is None and ids[-1] == tokenizer.eos_token_id):
        return tokenizer.decode(ids[:-1], skip_special_tokens=False)
    if isinstance(matched, str) and matched in output_text:
        return output_text[: output_text.rfind(matched)]
    return output_text


def sampling_overrides(body: dict[str, Any]) -> dict[str, Any]:
    """SGLang sampling parameters a request sets (the rollout's apply otherwise)."""
    params: dict[str, Any] = {}
    pairs = [("temperature", "temperature"), ("top_p", "top_p"), ("sampling_seed", "seed")]
    pairs += [(k, k) for k in ("top_k", "min_p", "regex", "ebnf", "ignore_eos")]  # SGLang's own, as extra_body
    for ours, theirs in pairs:
        if body.get(theirs) is not None:
            params[ours] = body[theirs]
    response_format = body.get("response_format") or {}
    if response_format.get("type") == "json_schema":
        params["json_schema"] = json.dumps(response_format["json_schema"].get("schema", {}))
    stop = body.get("stop")
    if stop:
        params["stop"] = [stop] if isinstance(stop, str) else list(stop)
    return params
