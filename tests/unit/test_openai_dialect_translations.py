"""The endpoint's Responses and Anthropic Messages dialects (rollout/openai_responses.py, rollout/anthropic_messages.py)
without a server: their translations to and from a chat turn, `previous_response_id`, and their server-sent events
read by the official SDKs' own stream parsers (the SDK clients over an httpx transport that answers with them).

The chat turn is faked (`complete_chat` patched) the way the endpoint's streaming calls it: text deltas, then the
finished answer; tests/integration/test_openai_dialects.py runs the same through SGLang."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest

from rollout import anthropic_messages as am
from rollout import openai_chat
from rollout import openai_responses as responses
from rollout.openai_session import Conversation, EndpointError

ADD = {"type": "function", "name": "add", "description": "Add.", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}  # fmt: skip
CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 3}'}}


def chat_answer(content: str | None, calls: list[dict[str, Any]] | None = None, finish: str = "stop") -> dict[str, Any]:
    """A chat.completion answer as openai_chat.complete_chat returns it."""
    message: dict[str, Any] = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
    choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
    usage = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
    return {"id": "chatcmpl-abc", "object": "chat.completion", "created": 1, "model": "m", "choices": [choice], "usage": usage}  # fmt: skip


# --- Responses: request -> chat --------------------------------------------------------------------------------------


def test_responses_input_items_become_chat_messages() -> None:
    body = {
        "instructions": "be brief",
        "input": [
            {"role": "developer", "content": "rules"},
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "add"}, {"type": "input_text", "text": "3"}],
            },
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "think"}]},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "sure", "annotations": []}],
            },
            {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a": 3}'},
            {"type": "function_call", "call_id": "c2", "name": "add", "arguments": '{"a": 4}'},
            {"type": "function_call_output", "call_id": "c1", "output": "6"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "8"}]},
            {"type": "function_call", "call_id": "c3", "name": "add", "arguments": "{}"},
        ],
        "tools": [ADD],
        "tool_choice": {"type": "function", "name": "add"},
        "max_output_tokens": 9,
        "temperature": 0.5,
        "regex": "x",  # SGLang's own, as extra_body
        "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}}},
        "include": [],
        "parallel_tool_calls": True,
    }
    out = responses.to_chat(body)
    call = lambda i, a: {"id": f"c{i}", "type": "function", "function": {"name": "add", "arguments": a}}  # noqa: E731
    assert out["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "add\n3"},
        {"role": "assistant", "content": "sure", "tool_calls": [call(1, '{"a": 3}'), call(2, '{"a": 4}')]},
        {"role": "tool", "tool_call_id": "c1", "content": "6"},
        {"role": "tool", "tool_call_id": "c2", "content": "8"},
        {"role": "assistant", "content": "", "tool_calls": [call(3, "{}")]},  # after a tool output: a new turn
    ]
    assert out["tools"] == [{"type": "function", "function": {k: v for k, v in ADD.items() if k != "type"}}]
    assert out["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert (out["max_tokens"], out["temperature"], out["regex"]) == (9, 0.5, "x")
    assert out["response_format"]["json_schema"] == {"name": "out", "schema": {"type": "object"}}
    # Reasoning is kept only for a template that renders it, on the assistant turn it precedes.
    with_reasoning = responses.to_chat(body, reasoning=True)["messages"]
    assert with_reasoning[3]["reasoning_content"] == "think" and "reasoning_content" not in with_reasoning[6]
    assert responses.to_chat({"input": "hi"})["messages"] == [{"role": "user", "content": "hi"}]
    tokenizer = SimpleNamespace(chat_template="{{ m.reasoning_content }}")
    assert responses.shows_reasoning(tokenizer) and not responses.shows_reasoning(SimpleNamespace(chat_template=None))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"input": []}, "`input` must be"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "type 'item_reference'"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}, "text only"),
        ({"input": [{"role": "tool", "content": "x"}]}, "role 'tool'"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "function tools only"),
        ({"input": "hi", "tool_choice": {"type": "allowed_tools"}}, "`tool_choice`"),
        ({"input": "hi", "conversation": "conv_1"}, "`conversation`"),
        ({"input": "hi", "text": {"format": {"type": "json_object"}}}, "json_object"),
    ],
)
def test_responses_refuses_what_it_cannot_serve(body: dict[str, Any], message: str) -> None:
    with pytest.raises(EndpointError, match=message) as err:
        responses.to_chat(body)
    assert err.value.status == 400


def test_responses_answer_from_a_chat_turn() -> None:
    body = {"model": "policy", "input": "add 3", "tools": [ADD], "max_output_tokens": 9, "metadata": {"k": "v"}}
    out = responses.from_chat(body, chat_answer("ok", [CALL], "tool_calls"))
    assert out["id"].startswith("resp_") and out["object"] == "response" and out["status"] == "completed"
    message, call = out["output"]
    assert message["type"] == "message" and message["content"][0]["text"] == "ok"
    assert call["type"] == "function_call" and (call["call_id"], call["name"], call["arguments"]) == ("call_1", "add", '{"a": 3}')  # fmt: skip
    assert out["usage"]["input_tokens"] == 11 and out["usage"]["output_tokens"] == 7 and out["metadata"] == {"k": "v"}
    parsed = openai.types.responses.Response.model_validate(out)  # the SDK's own model, validated
    assert parsed.output_text == "ok" and parsed.model == "policy"
    cut = responses.from_chat(body, chat_answer("o", finish="length"))
    assert cut["status"] == "incomplete" and cut["incomplete_details"] == {"reason": "max_output_tokens"}
    assert cut["output"][0]["status"] == "incomplete"


# --- Anthropic: request -> chat -> message ---------------------------------------------------------------------------


def test_anthropic_messages_become_chat_messages() -> None:
    tool = {"name": "add", "description": "Add.", "input_schema": ADD["parameters"]}
    body = {
        "model": "m",
        "max_tokens": 8,
        "system": [{"type": "text", "text": "be"}, {"type": "text", "text": "brief"}],
        "messages": [
            {"role": "user", "content": "add 3"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "s"},
                    {"type": "text", "text": "sure"},
                    {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": "é"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "6"}]},
                    {"type": "text", "text": "more"},
                ],
            },
        ],
        "tools": [tool],
        "tool_choice": {"type": "any"},
        "stop_sequences": ["END"],
        "top_k": 5,
    }
    out = am.to_chat(body)
    call = {"id": "t1", "type": "function", "function": {"name": "add", "arguments": '{"a": "é"}'}}
    assert out["messages"] == [
        {"role": "system", "content": "be\nbrief"},
        {"role": "user", "content": "add 3"},
        {"role": "assistant", "content": "sure", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "t1", "content": "6"},
        {"role": "user", "content": "more"},
    ]
    assert out["tools"][0]["function"]["parameters"] == ADD["parameters"] and out["tool_choice"] == "required"
    assert (out["max_tokens"], out["stop"], out["top_k"]) == (8, ["END"], 5)
    assert am.to_chat(body, reasoning=True)["messages"][2]["reasoning_content"] == "hm"
    assert am.to_chat({**body, "tool_choice": {"type": "tool", "name": "add"}})["tool_choice"]["function"] == {"name": "add"}  # fmt: skip


def test_anthropic_message_from_a_chat_turn() -> None:
    body = {"model": "claude", "max_tokens": 8, "stop_sequences": ["END"]}
    message = am.from_chat(body, chat_answer("ok", [CALL], "tool_calls"))
    assert message["content"] == [{"type": "text", "text": "ok"}, {"type": "tool_use", "id": "call_1", "name": "add", "input": {"a": 3}}]  # fmt: skip
    assert message["stop_reason"] == "tool_use" and message["usage"] == {"input_tokens": 11, "output_tokens": 7}
    assert anthropic.types.Message.model_validate(message).model == "claude"
    assert am.from_chat(body, chat_answer("x", finish="length"))["stop_reason"] == "max_tokens"
    stopped = am.from_chat(body, chat_answer("x"), matched_stop="END")
    assert (stopped["stop_reason"], stopped["stop_sequence"]) == ("stop_sequence", "END")
    assert am.from_chat(body, chat_answer("x"), matched_stop=151645)["stop_reason"] == "end_turn"  # an EOS id


# --- the handlers, over a faked streaming chat turn ------------------------------------------------------------------


class FakeTurns:
    """`openai_chat.complete_chat` as the streaming endpoint calls it: text deltas, then the finished answer."""

    def __init__(self, answers: list[tuple[list[str], dict[str, Any]]]) -> None:
        self.answers, self.bodies = answers, []

    async def __call__(self, endpoint: Any, conv: Conversation, body: dict[str, Any], stream: Any = None) -> Any:
        self.bodies.append(body)
        deltas, answer = self.answers.pop(0)
        if stream is not None:
            for delta in deltas:
                await stream.text(delta)
            await stream.finish(answer)
        return answer


ENDPOINT = SimpleNamespace(ctx=SimpleNamespace(tokenizer=SimpleNamespace(chat_template="{{ m.content }}")))


def served(sse: bytes, lib: Any = httpx) -> Any:
    """An httpx client whose every request is answered with these server-sent events (`lib`: httpx, or httpx2 for
    the anthropic SDK, which uses that fork)."""
    answer = lambda request: lib.Response(200, headers={"content-type": "text/event-stream"}, content=sse)  # noqa: E731
    return lib.Client(transport=lib.MockTransport(answer))


def data_of(sse: bytes) -> list[dict[str, Any]]:
    """The JSON of each server-sent event."""
    return [json.loads(line[6:]) for line in sse.decode().splitlines() if line.startswith("data: ")]


def run_streamed(handler: Any, make_stream: Any, conv: Conversation, body: dict[str, Any]) -> tuple[Any, bytes]:
    """The handler's answer and the bytes its stream emitted."""
    sent: list[bytes] = []

    async def emit(data: bytes) -> None:
        sent.append(data)

    async def main() -> Any:
        return await handler(ENDPOINT, conv, body, make_stream(body, emit, "served-model"))

    return asyncio.run(main()), b"".join(sent)


def test_responses_stream_is_read_by_the_openai_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    turns = FakeTurns([(["He", "llo"], chat_answer("Hello", [CALL], "tool_calls")), ([], chat_answer("done"))])
    monkeypatch.setattr(openai_chat, "complete_chat", turns)
    conv = Conversation("s", 0, {}, 100)
    body = {"model": "m", "input": "add 3", "tools": [ADD], "stream": True}
    answer, sse = run_streamed(responses.handler, responses.make_stream, conv, body)
    client = openai.OpenAI(api_key="k", base_url="http://x/v1", http_client=served(sse))
    kinds = [event.type for event in client.responses.create(model="m", input="x", stream=True)]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    with client.responses.stream(model="m", input="x", tools=[ADD]) as stream:  # the SDK's accumulating parser
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert deltas == ["He", "llo"] and final.output_text == "Hello" and final.id == answer["id"]
    (call,) = [item for item in final.output if item.type == "function_call"]
    assert (call.call_id, call.arguments) == ("call_1", '{"a": 3}')
    assert final.model_dump(exclude_none=True) == openai.types.responses.Response.model_validate(answer).model_dump(exclude_none=True)  # fmt: skip
    # The next call names it: its input and output come first, the stored response's ids are the streamed ones.
    output = {"type": "function_call_output", "call_id": "call_1", "output": "6"}
    second, _ = run_streamed(responses.handler, responses.make_stream, conv, {"input": [output], "previous_response_id": final.id, "stream": False})  # fmt: skip
    assert second["output"][0]["content"][0]["text"] == "done" and second["previous_response_id"] == final.id
    assert [m["role"] for m in turns.bodies[1]["messages"]] == ["user", "assistant", "tool"]
    assert turns.bodies[1]["messages"][1] == {"role": "assistant", "content": "Hello", "tool_calls": [CALL]}
    with pytest.raises(EndpointError, match="resp_unknown") as err:
        asyncio.run(responses.handler(ENDPOINT, conv, {"input": "x", "previous_response_id": "resp_unknown"}))
    assert err.value.status == 400
    assert list(conv.responses) == [answer["id"], second["id"]]  # `store: false` keeps nothing: below
    monkeypatch.setattr(openai_chat, "complete_chat", FakeTurns([([], chat_answer("x"))]))
    asyncio.run(responses.handler(ENDPOINT, conv, {"input": "x", "store": False}))
    assert len(conv.responses) == 2


def test_responses_events_of_a_finished_turn_and_a_cut_one() -> None:
    """`events` (a whole answer at once, as the endpoint sent before streaming) and `response.incomplete`."""
    body = {"model": "m", "input": "x"}
    for answer, last in ((chat_answer("ok", [CALL], "tool_calls"), "response.completed"), (chat_answer("o", finish="length"), "response.incomplete")):  # fmt: skip
        response = responses.from_chat(body, answer)
        client = openai.OpenAI(api_key="k", base_url="http://x/v1", http_client=served(b"".join(responses.events(body, response))))  # fmt: skip
        got = list(client.responses.create(model="m", input="x", stream=True))
        assert got[-1].type == last and got[-1].response.id == response["id"]
        assert [e.sequence_number for e in got] == list(range(len(got)))
    # A streamed text the final reply drops (text before a tool call): its item ends, the call comes after it.
    stream = responses.ResponsesStream(body, None, "m")
    stream.on_text(" ")
    ends = data_of(b"".join(stream.on_finish(responses.from_chat(body, chat_answer(None, [CALL], "tool_calls")))))
    assert [e["type"] for e in ends[:3]] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]  # fmt: skip
    assert ends[3]["type"] == "response.output_item.added" and ends[3]["output_index"] == 1


def test_anthropic_stream_is_read_by_the_anthropic_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openai_chat, "complete_chat", FakeTurns([(["He", "llo"], chat_answer("Hello", [CALL], "tool_calls"))]))  # fmt: skip
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "add 3"}], "stream": True}
    answer, sse = run_streamed(am.handler, am.make_stream, Conversation("s", 0, {}, 100), body)
    client = anthropic.Anthropic(api_key="k", base_url="http://x", http_client=served(sse, httpx2))
    with client.messages.stream(model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}]) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert texts == ["He", "llo"] and final.id == answer["id"] and final.stop_reason == "tool_use"
    assert final.model_dump() == anthropic.types.Message.model_validate(answer).model_dump()
    raw = [e.type for e in client.messages.create(model="m", max_tokens=8, messages=[], stream=True)]
    assert raw == ["message_start", "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
                   "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"]  # fmt: skip
    # A whole answer at once (slime's adapter), and a streamed text the final reply drops.
    whole = served(b"".join(am.events(body, answer)), httpx2)
    with anthropic.Anthropic(api_key="k", base_url="http://x", http_client=whole).messages.stream(model="m", max_tokens=8, messages=[]) as s:  # fmt: skip
        assert s.get_final_message().model_dump() == final.model_dump()
    stream = am.MessagesStream(body, None, "m")
    stream.on_text(" ")
    events = data_of(b"".join(stream.on_finish(am.from_chat(body, chat_answer(None, [CALL], "tool_calls")))))
    assert [(e["type"], e.get("index")) for e in events[:2]] == [("content_block_stop", 0), ("content_block_start", 1)]


def test_anthropic_requires_max_tokens() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(EndpointError, match="max_tokens") as err:
        asyncio.run(am.handler(ENDPOINT, Conversation("s", 0, {}, 100), body))
    assert err.value.status == 400
    with pytest.raises(EndpointError, match="role 'system'"):
        am.to_chat({"messages": [{"role": "system", "content": [{"type": "text", "text": "x"}]}]})
