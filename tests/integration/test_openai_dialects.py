"""The endpoint's Responses and Anthropic Messages dialects end to end on the session's SGLang server, through the
official SDKs unchanged: `openai`'s responses API (a forced function call, its output sent back with
`previous_response_id`, streamed), `anthropic`'s messages (tool_use, then tool_result, streamed), and an
`openai-agents` Agent on its default `OpenAIResponsesModel` (a Python tool, run and streamed). Each session's
trajectory is token-exact: its branch holds exactly the ids SGLang was sent and sampled, and what was streamed is
the text of those ids."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest

import rollout.generate
from rollout.context import RolloutContext
from rollout.openai_endpoint import OpenAIEndpoint
from rollout.openai_session import Conversation
from rollout.sglang_server import SGLangServer
from slime_like.arguments import parse_args
from slime_like.core.sample import Sample
from tests.integration.test_openai_endpoint import ADD, CALL_REGEX, TOOLS_TEMPLATE

ADD_FLAT = {"type": "function", **ADD["function"]}  # Responses' function tool shape
ADD_ANTHROPIC = {"name": "add", "description": "Add.", "input_schema": ADD["function"]["parameters"]}


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tiny model's vocabulary with a chat template that renders tools (Qwen2.5's shape)."""
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("dialects-tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_qwen3 / name, out / name)
    (out / "chat_template.jinja").write_text(TOOLS_TEMPLATE)
    return AutoTokenizer.from_pretrained(out)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """Every /generate the endpoint sends: its rid, input ids and SGLang's answer."""
    calls: list[dict[str, Any]] = []
    original = rollout.generate.post_generate

    async def recording(ctx: Any, payload: dict[str, Any], *args: Any, **kw: Any) -> dict[str, Any]:
        out = await original(ctx, payload, *args, **kw)
        calls.append({"rid": payload["rid"], "input_ids": list(payload["input_ids"]), "out": out})
        return out

    monkeypatch.setattr(rollout.generate, "post_generate", recording)
    yield calls


def serve(tiny_qwen3: Path, tokenizer: Any, server: SGLangServer, calls: Any) -> None:
    """Run `calls(endpoint, http)` against an endpoint (tool calls parsed by SGLang's qwen25 parser) on `server`."""
    flags = ["--hf-checkpoint", str(tiny_qwen3), "--prompt-data", "x", "--rollout-batch-size", "1"]
    args = parse_args([*flags, "--num-rollout", "1", "--sglang-tool-call-parser", "qwen25"])

    async def main() -> None:
        async with aiohttp.ClientSession() as http:
            endpoint = await OpenAIEndpoint(RolloutContext(args, tokenizer, server.url, http, asyncio.Semaphore(4))).start()  # fmt: skip
            try:
                await calls(endpoint)
            finally:
                await endpoint.stop()

    asyncio.run(main())


def open_session(endpoint: OpenAIEndpoint, index: int) -> tuple[Conversation, str]:
    """A new session and its base URL (without /v1: each SDK adds its own path)."""
    conv = endpoint.open_session(Sample(index=index), {"max_new_tokens": 160, "temperature": 1.0})
    return conv, endpoint.base_url(conv).removesuffix("/v1")


def assert_token_exact(conv: Conversation, sent: list[dict[str, Any]], turns: int, tokenizer: Any) -> list[str]:
    """The session is one branch whose turns are the /generate calls it sent, each extending the one before, its
    tokens exactly the ids sent and sampled (log-probs SGLang's); the template showed each turn as sampled. The
    text of each turn's sampled ids (less an EOS) is returned."""
    (branch,) = conv.branches
    calls = [c for c in sent if c["rid"].startswith(f"openai-{conv.id}-")]
    assert len(branch.turns) == len(calls) == turns and branch.drift == 0
    texts, pos = [], 0
    for turn, call in zip(branch.turns, calls, strict=True):
        pairs = call["out"]["meta_info"]["output_token_logprobs"]
        ids, lps = [int(p[1]) for p in pairs], [float(p[0]) for p in pairs]
        assert turn.input_ids == call["input_ids"] and turn.output_ids == ids
        assert call["input_ids"][:pos] == branch.tokens[:pos]  # each call sends the tokens so far, then new ones
        pos = len(call["input_ids"])
        assert branch.tokens[pos : pos + len(ids)] == ids
        r = pos - branch.prompt_length
        assert branch.loss_mask[r : r + len(ids)] == [1] * len(ids) and branch.log_probs[r : r + len(ids)] == lps
        pos += len(ids)
        texts.append(tokenizer.decode(ids[:-1] if ids[-1] == tokenizer.eos_token_id else ids))
    assert pos == len(branch.tokens)
    assert branch.loss_mask.count(1) == sum(len(t.output_ids) for t in branch.turns)  # the rest is context
    return texts


def test_responses_api_tool_call_previous_response_and_stream(
    tiny_qwen3: Path, tokenizer: Any, sglang_server: SGLangServer, sent: list[dict[str, Any]]
) -> None:
    """`client.responses.create`: a function call (forced with SGLang's regex), its output sent back naming the
    response (`previous_response_id`) and streamed; an unknown previous id is a 400."""

    async def calls(endpoint: OpenAIEndpoint) -> None:
        conv, url = open_session(endpoint, 0)
        result: dict[str, Any] = {}

        def sdk() -> None:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key=endpoint.api_key, max_retries=0)
            first = client.responses.create(
                model="m", input="add 3", tools=[ADD_FLAT], max_output_tokens=60, extra_body={"regex": CALL_REGEX}
            )
            (call,) = first.output
            assert first.status == "completed" and call.type == "function_call" and call.name == "add"
            assert set(json.loads(call.arguments)) == {"a"}
            output = {"type": "function_call_output", "call_id": call.call_id, "output": "6"}
            events = list(
                client.responses.create(
                    model="m", previous_response_id=first.id, input=[output], tools=[ADD_FLAT], max_output_tokens=30,
                    stream=True, extra_body={"regex": "[a-z ]{1,1000}", "ignore_eos": True},
                )
            )  # fmt: skip
            kinds = [e.type for e in events]
            # Cut at max_output_tokens (EOS ignored): `response.incomplete`, the text in deltas as it was generated.
            assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.incomplete"
            final = events[-1].response
            deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
            assert len(deltas) > 1 and final.incomplete_details.reason == "max_output_tokens"
            result["streamed"] = "".join(deltas)
            assert result["streamed"] == final.output_text and final.previous_response_id == first.id
            assert [e.sequence_number for e in events] == list(range(len(events)))
            with pytest.raises(openai.BadRequestError, match="resp_nope"):
                client.responses.create(model="m", previous_response_id="resp_nope", input="hi")

        await asyncio.to_thread(sdk)
        first, second = assert_token_exact(conv, sent, 2, tokenizer)
        assert first.startswith("<tool_call>\n") and second == result["streamed"]
        branch = conv.branches[0]
        inserted = branch.turns[1].input_ids[len(branch.turns[0].input_ids) + len(branch.turns[0].output_ids) :]
        assert tokenizer.decode(inserted).startswith("\n<|im_start|>user\n<tool_response>\n6\n</tool_response>")

    serve(tiny_qwen3, tokenizer, sglang_server, calls)


def test_anthropic_messages_tool_use_then_tool_result_streamed(
    tiny_qwen3: Path, tokenizer: Any, sglang_server: SGLangServer, sent: list[dict[str, Any]]
) -> None:
    """`client.messages.create` answers with tool_use; `client.messages.stream` (the key as x-api-key) continues
    with its tool_result, the text as it is generated."""

    async def calls(endpoint: OpenAIEndpoint) -> None:
        conv, url = open_session(endpoint, 1)
        result: dict[str, Any] = {}

        def sdk() -> None:
            client = anthropic.Anthropic(base_url=url, api_key=endpoint.api_key, max_retries=0)
            messages: list[dict[str, Any]] = [{"role": "user", "content": "add 3"}]
            first = client.messages.create(
                model="m", max_tokens=60, messages=messages, tools=[ADD_ANTHROPIC], system=[{"type": "text", "text": "be brief"}],
                extra_body={"regex": CALL_REGEX},
            )  # fmt: skip
            (use,) = first.content
            assert first.stop_reason == "tool_use" and use.type == "tool_use" and set(use.input) == {"a"}
            messages += [
                {"role": "assistant", "content": [b.model_dump() for b in first.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "6"}]},
            ]
            with client.messages.stream(
                model="m", max_tokens=30, messages=messages, tools=[ADD_ANTHROPIC], system="be brief",
                extra_body={"regex": "[a-z ]{1,1000}", "ignore_eos": True},
            ) as stream:  # fmt: skip
                pieces = list(stream.text_stream)
                final = stream.get_final_message()
            result["streamed"] = "".join(pieces)
            assert len(pieces) > 1 and final.stop_reason == "max_tokens" and final.content[0].text == result["streamed"]
            assert final.usage.input_tokens > first.usage.input_tokens and final.usage.output_tokens >= 1
            with pytest.raises(anthropic.AuthenticationError):
                anthropic.Anthropic(base_url=url, api_key="wrong", max_retries=0).messages.create(model="m", max_tokens=4, messages=messages)  # fmt: skip

        await asyncio.to_thread(sdk)
        first, second = assert_token_exact(conv, sent, 2, tokenizer)
        assert first.startswith("<tool_call>\n") and second == result["streamed"]
        assert "<tool_response>\n6\n</tool_response>" in tokenizer.decode(conv.branches[0].tokens)

    serve(tiny_qwen3, tokenizer, sglang_server, calls)


def test_openai_agents_on_its_default_responses_model(
    tiny_qwen3: Path, tokenizer: Any, sglang_server: SGLangServer, sent: list[dict[str, Any]]
) -> None:
    """An `openai-agents` Agent with a function tool on `OpenAIResponsesModel`, unchanged: run, then run streamed,
    each on its own session: the model calls the tool, the SDK runs it and sends the result back, the model answers."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, ToolCallOutputItem, set_tracing_disabled

    from plugins.openai_agents_example import CALL_DOUBLE, AnswerAfterTheTool, double

    set_tracing_disabled(True)

    async def calls(endpoint: OpenAIEndpoint) -> None:
        for index, streamed in ((2, False), (3, True)):
            conv, url = open_session(endpoint, index)
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=endpoint.api_key, max_retries=0)
            agent = Agent(
                name="calculator",
                instructions="Double the digit with the double tool, then answer with the result only.",
                tools=[double],
                model=OpenAIResponsesModel(model="policy", openai_client=client),
                model_settings=ModelSettings(max_tokens=96, extra_body={"regex": CALL_DOUBLE}),
                hooks=AnswerAfterTheTool(),
            )
            if streamed:
                result = Runner.run_streamed(agent, input="double 3", max_turns=3)
                kinds = {event.type async for event in result.stream_events()}
                assert "raw_response_event" in kinds
            else:
                result = await Runner.run(agent, input="double 3", max_turns=3)
            (tool_output,) = [item.output for item in result.new_items if isinstance(item, ToolCallOutputItem)]
            call, answer = assert_token_exact(conv, sent, 2, tokenizer)
            digit = json.loads(call.split("<tool_call>\n")[1].split("\n</tool_call>")[0])["arguments"]["digit"]
            assert tool_output == str(2 * int(digit))  # the SDK ran our tool on the model's arguments
            assert str(result.final_output) == answer  # ... and the model's answer is the run's output
            assert f"<tool_response>\n{tool_output}\n</tool_response>" in tokenizer.decode(conv.branches[0].tokens)

    serve(tiny_qwen3, tokenizer, sglang_server, calls)
