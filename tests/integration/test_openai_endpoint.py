"""The OpenAI-compatible endpoint end to end on a real SGLang server: the OpenAI SDK unchanged, exact tokens.

One rollout of a group of 4 agents written with the `openai` SDK: samples 0 and 1 talk for 3 turns, sample 2
raises after its first turn, sample 3 hangs past its timeout. Every /generate the endpoint sent is recorded.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from plugins import openai_agent
from plugins.tool_chat_template import chatml_tool_template
from rollout import sglang_client as client
from rollout.context import RolloutContext
from rollout.openai_endpoint import OpenAIEndpoint
from rollout.sglang_server import SGLangServer
from slime_like.arguments import parse_args
from slime_like.core.sample import Sample, Status
from tests.integration.recorded_rollout import agent_args, recorded_rollout

PLUGIN = r"""
import asyncio
import openai
from plugins.openai_agent import run_openai_agent

ENDED = []  # (base_url, api_key) of the sessions that finished, for calls after the end


async def agent(base_url, api_key, sample):
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = list(sample.prompt)
    for turn in range(3):
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=6, temperature=1.0)
        if sample.index % 4 == 2:
            raise RuntimeError("the agent's own bug")
        if sample.index % 4 == 3:
            await asyncio.sleep(3600)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content}, {"role": "user", "content": f"turn {turn}: go on"}]
        sample.metadata.setdefault("usage", []).append(reply.usage.model_dump())
    ENDED.append((base_url, api_key))


async def generate(ctx, sample, params):
    return await run_openai_agent(ctx, sample, params, agent, timeout=4.0)
"""


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("openai-agent")
    row = {"prompt": [{"role": "user", "content": "What is 6 times 7?"}], "label": "42"}
    (root / "train.jsonl").write_text(json.dumps(row) + "\n")
    (root / "openai_agent_under_test.py").write_text(PLUGIN)
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))
    sys.modules.pop("openai_agent_under_test", None)


@pytest.fixture(scope="module")
def run(
    tiny_qwen3: Path, task: Path, sglang_server: SGLangServer
) -> Iterator[tuple[list[Sample], dict[str, Any], list[dict[str, Any]]]]:
    """One rollout of 4 agent samples; every /generate the endpoint sent, with its answer."""
    args = agent_args(
        tiny_qwen3, task, "openai_agent_under_test.generate", "--label-key", "label", "--rm-type", "f1",
        samples=4, max_response_len=200,
    )  # fmt: skip
    groups, metrics, sent = recorded_rollout(args, sglang_server.url)
    assert len(groups) == 1
    yield groups[0], metrics, sent


def turns_of(sample: Sample, sent: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The requests this sample's session sent, in order."""
    return sorted(
        (r for r in sent if r["rid"].startswith(f"openai-{sample.index}-")), key=lambda r: len(r["input_ids"])
    )


def outputs(turn: dict[str, Any]) -> tuple[list[int], list[float]]:
    """A turn's sampled ids and their log-probs as SGLang reported them."""
    pairs = turn["out"]["meta_info"]["output_token_logprobs"]
    return [int(t[1]) for t in pairs], [float(t[0]) for t in pairs]


def test_three_turns_are_token_exact(run: Any) -> None:
    group, _, sent = run
    for sample in group[:2]:
        assert sample.status == Status.COMPLETED, sample.metadata
        turns = turns_of(sample, sent)
        assert len(turns) == 3 == sample.metadata["openai_turns"]
        assert sample.prompt_length == len(turns[0]["input_ids"])
        assert sample.tokens[: sample.prompt_length] == turns[0]["input_ids"]
        mask, lps, pos = sample.loss_mask, sample.rollout_log_probs, sample.prompt_length
        assert len(sample.tokens) == pos + sample.response_length == pos + len(mask) == pos + len(lps)
        for k, turn in enumerate(turns):
            ids, logps = outputs(turn)
            assert len(turn["input_ids"]) == pos  # each turn sends exactly the tokens so far
            assert sample.tokens[:pos] == turn["input_ids"]
            r = pos - sample.prompt_length
            assert sample.tokens[pos : pos + len(ids)] == ids
            assert mask[r : r + len(ids)] == [1] * len(ids) and lps[r : r + len(ids)] == logps
            pos += len(ids)
            if k + 1 < len(turns):  # the next turn: the previous turn's ids, what the model wrote, the new user turn
                inserted = len(turns[k + 1]["input_ids"]) - pos
                assert inserted > 0
                r = pos - sample.prompt_length
                assert mask[r : r + inserted] == [0] * inserted and lps[r : r + inserted] == [0.0] * inserted
                pos += inserted
        assert pos == len(sample.tokens)  # the sample ends with the model's last turn
        assert [u["completion_tokens"] for u in sample.metadata["usage"]] == [len(outputs(t)[0]) for t in turns]


def test_inserted_turns_render_the_conversation(run: Any, tiny_qwen3: Path) -> None:
    """The user turns the endpoint inserted decode to the chat template's text for them."""
    group, _, _ = run
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3)
    sample = group[0]
    inserted = [t for t, m in zip(sample.tokens[sample.prompt_length :], sample.loss_mask, strict=True) if m == 0]
    text = tokenizer.decode(inserted, skip_special_tokens=False)
    assert "<|im_start|>user\nturn 0: go on<|im_end|>\n<|im_start|>assistant\n" in text
    assert "turn 1: go on" in text and "turn 2" not in text


def test_rollout_log_probs_match_a_prompt_logprob_probe(run: Any, sglang_server: SGLangServer) -> None:
    """SGLang scores the sample's own ids again (teacher forcing): model tokens within 1e-4 of the rollout's."""
    group, _, _ = run
    for sample in group[:2]:
        # Log-probs of tokens[1:]: the response's are the last response_length of them.
        probe = client.prompt_logprobs(sglang_server.url, sample.tokens)[sample.prompt_length - 1 :]
        assert len(probe) == sample.response_length
        model = [(p, r) for p, r, m in zip(probe, sample.rollout_log_probs, sample.loss_mask, strict=True) if m]
        assert len(model) == sum(sample.loss_mask) > 0
        assert max(abs(p - r) for p, r in model) < 1e-4


def test_failing_and_hanging_agents_fail_their_sample_only(run: Any) -> None:
    group, metrics, _ = run
    assert len(group) == 4  # nothing lost
    raised, hung = group[2], group[3]
    assert raised.status == hung.status == Status.FAILED
    assert raised.metadata["agent_error"] == "agent raised RuntimeError: the agent's own bug"
    assert hung.metadata["agent_error"] == "agent timed out after 4s"
    # Each still holds the turn it had: its tokens are the ones sampled.
    assert raised.metadata["openai_turns"] == hung.metadata["openai_turns"] == 1
    assert metrics["rollout/openai_agent_failed"] == 1 and metrics["rollout/openai_agent_timeout"] == 1
    assert metrics["rollout/generate_failed"] == 2
    assert metrics["rollout/openai_turns"] == 8


def test_calls_after_the_rollout_fail_clearly(run: Any) -> None:
    """The endpoint stopped with its rollout: an agent that calls again gets an error, not a hang."""
    module = sys.modules["openai_agent_under_test"]
    base_url, key = module.ENDED[0]
    client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=5)
    with pytest.raises(openai.APIConnectionError):
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])


def test_sdk_client_auth_and_ended_sessions(tiny_qwen3: Path, sglang_server: SGLangServer) -> None:
    """The synchronous OpenAI client unchanged; a wrong key is refused; an ended session answers 404."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3)

    async def main() -> None:
        async with aiohttp.ClientSession() as http:
            args = parse_args(
                [
                    "--hf-checkpoint",
                    str(tiny_qwen3),
                    "--prompt-data",
                    "x.jsonl",
                    "--rollout-batch-size",
                    "1",
                    "--num-rollout",
                    "1",
                ]
            )
            ctx = RolloutContext(
                args, tokenizer, sglang_server.url, http, asyncio.Semaphore(4), server_urls=[sglang_server.url]
            )
            endpoint = await OpenAIEndpoint(ctx).start()
            try:
                session = endpoint.open_session(Sample(index=7), {"max_new_tokens": 64, "temperature": 1.0})
                url = endpoint.base_url(session)
                messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]

                def sdk_calls() -> None:
                    client = openai.OpenAI(base_url=url, api_key=endpoint.api_key, max_retries=0)
                    assert [m.id for m in client.models.list()] == [str(tiny_qwen3)]
                    reply = client.chat.completions.create(model="m", messages=messages, max_tokens=5, stop=["zzz"])
                    assert reply.choices[0].message.role == "assistant" and reply.usage.completion_tokens <= 5
                    assert reply.choices[0].finish_reason in ("stop", "length")
                    with pytest.raises(openai.AuthenticationError):
                        openai.OpenAI(base_url=url, api_key="wrong", max_retries=0).models.list()
                    # Another conversation on the same session: served on a branch of its own.
                    other = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
                    assert other.usage.prompt_tokens < reply.usage.prompt_tokens
                    session.strict = True  # --openai-strict-history: a changed history is refused
                    with pytest.raises(openai.BadRequestError, match="do not extend"):
                        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "y"}])

                await asyncio.to_thread(sdk_calls)
                assert len(session.turns) == 2 and len(session.branches) == 2
                first = session.branches[0]
                assert first.tokens[: first.prompt_length] == first.turns[0].input_ids
                await endpoint.close_session(session.id)
                with pytest.raises(openai.NotFoundError, match="ended session"):
                    await openai.AsyncOpenAI(base_url=url, api_key=endpoint.api_key, max_retries=0).models.list()
            finally:
                await endpoint.stop()
            assert ctx.counters["openai_unauthorized"] == 1 and ctx.counters["openai_history_mismatch"] == 1
            assert ctx.counters["openai_branches"] == 1 and ctx.counters["openai_reprefill_tokens"] == len(
                session.branches[1].turns[0].input_ids
            )
            # The shipped example agent (the SDK, two turns when the first one ends before the budget).
            sample = Sample(index=1, prompt=[{"role": "user", "content": "What is 6 times 7?"}])
            await openai_agent.generate(ctx, sample, {"max_new_tokens": 120, "temperature": 1.0})
            assert sample.status in (Status.COMPLETED, Status.TRUNCATED) and sample.metadata["openai_turns"] >= 1
            assert sample.response_length == len(sample.loss_mask) > 0 and "agent_answer" in sample.metadata
            assert "openai_endpoint" not in ctx.plugin_state  # its endpoint stopped with its last session

    asyncio.run(main())


# Qwen2.5's shape: the tools in a system turn only when there are some, a tool's result as a user turn.
TOOLS_TEMPLATE = chatml_tool_template(
    """
{%- if tools %}<|im_start|>system
Tools:
{% for t in tools %}{{ t | tojson }}
{% endfor %}<|im_end|>
{% endif %}""",
    tool_role="user",
)
ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}  # fmt: skip
CALL_REGEX = r'<tool_call>\n\{"name": "add", "arguments": \{"a": [1-9]\}\}\n</tool_call>'


def test_tool_calls_streaming_and_completions_stay_token_exact(
    tiny_qwen3: Path, sglang_server: SGLangServer, tmp_path: Path
) -> None:
    """A tool call parsed by SGLang's qwen25 parser and answered, a streamed turn, and /v1/completions, all with
    the OpenAI SDK; the session's tokens are exactly the ids sent and sampled."""
    import shutil

    from transformers import AutoTokenizer

    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_qwen3 / name, tmp_path / name)
    (tmp_path / "chat_template.jinja").write_text(TOOLS_TEMPLATE)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)  # the model's vocabulary, a template that renders tools

    async def main() -> None:
        async with aiohttp.ClientSession() as http:
            flags = [
                "--hf-checkpoint",
                str(tiny_qwen3),
                "--prompt-data",
                "x",
                "--rollout-batch-size",
                "1",
                "--num-rollout",
                "1",
            ]
            args = parse_args([*flags, "--sglang-tool-call-parser", "qwen25"])
            ctx = RolloutContext(args, tokenizer, sglang_server.url, http, asyncio.Semaphore(4))
            endpoint = await OpenAIEndpoint(ctx).start()
            try:
                chat = endpoint.open_session(Sample(index=0), {"max_new_tokens": 120, "temperature": 1.0})
                text = endpoint.open_session(Sample(index=1), {"max_new_tokens": 40, "temperature": 1.0})
                await asyncio.to_thread(sdk_calls, endpoint.base_url(chat), endpoint.base_url(text), endpoint.api_key)
            finally:
                await endpoint.stop()
            (branch,) = chat.branches  # the agent replayed the history as it got it: no branch
            first, second = branch.turns
            assert branch.tokens[: len(second.input_ids)] == second.input_ids
            assert (
                second.input_ids[: len(first.input_ids) + len(first.output_ids)] == first.input_ids + first.output_ids
            )
            inserted = second.input_ids[len(first.input_ids) + len(first.output_ids) :]
            assert tokenizer.decode(inserted).startswith("\n<|im_start|>user\n<tool_response>\n")
            assert branch.drift == 0  # the template shows the call exactly as it was sampled
            assert branch.tokens == second.input_ids + second.output_ids and ctx.counters["openai_tool_calls"] == 1
            # Without --sglang-tool-call-parser, tools are refused with the flag to add.
            bare = await OpenAIEndpoint(
                RolloutContext(parse_args(flags), tokenizer, "", http, asyncio.Semaphore(1))
            ).start()
            try:
                url = bare.base_url(bare.open_session(Sample(index=2), {"max_new_tokens": 8}))
                body = {"messages": [{"role": "user", "content": "hi"}], "tools": [ADD]}
                headers = {"Authorization": f"Bearer {bare.api_key}"}
                async with http.post(f"{url}/chat/completions", json=body, headers=headers) as answer:
                    assert answer.status == 400
                    assert "--sglang-tool-call-parser" in (await answer.json())["error"]["message"]
            finally:
                await bare.stop()
            one, two = text.turns
            assert two.input_ids[: len(one.input_ids) + len(one.output_ids)] == one.input_ids + one.output_ids
            assert tokenizer.decode(two.input_ids[len(one.input_ids) + len(one.output_ids) :]) == " and 3+3="

    asyncio.run(main())


def sdk_calls(chat_url: str, text_url: str, key: str) -> None:
    client = openai.OpenAI(base_url=chat_url, api_key=key, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "add 3"}]
    reply = client.chat.completions.create(
        model="m", messages=messages, tools=[ADD], max_tokens=60, extra_body={"regex": CALL_REGEX}
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "add" and set(json.loads(call.function.arguments)) == {"a"}
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "6"},
    ]
    stream = client.chat.completions.create(
        model="m", messages=messages, tools=[ADD], max_tokens=5, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-2].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].usage.completion_tokens >= 1

    text = openai.OpenAI(base_url=text_url, api_key=key, max_retries=0)
    first = text.completions.create(model="m", prompt="2+2=", max_tokens=3).choices[0].text
    text.completions.create(model="m", prompt="2+2=" + first + " and 3+3=", max_tokens=3)


def test_in_process_calls_answer_as_over_http(tiny_qwen3: Path, sglang_server: SGLangServer) -> None:
    """openai_client's in-process transport: the same answers, errors and counters as HTTP, streaming included; other
    URLs go through the pool; after the endpoint stopped, a connection error as over HTTP."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3)
    flags = ["--hf-checkpoint", str(tiny_qwen3), "--prompt-data", "x.jsonl", "--rollout-batch-size", "1"]

    async def main() -> None:
        async with aiohttp.ClientSession() as http:
            ctx = RolloutContext(parse_args([*flags, "--num-rollout", "1"]), tokenizer, sglang_server.url, http, asyncio.Semaphore(4))  # fmt: skip
            endpoint = await OpenAIEndpoint(ctx).start()
            session = endpoint.open_session(Sample(index=3), {"max_new_tokens": 64, "temperature": 1.0})
            url, key = endpoint.base_url(session), endpoint.api_key
            client = openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0, http_client=endpoint.http_client())
            try:
                assert [m.id for m in (await client.models.list()).data] == [str(tiny_qwen3)]
                messages = [{"role": "user", "content": "hi"}]
                stream = await client.chat.completions.create(model="m", messages=messages, max_tokens=6, stream=True)
                deltas = [c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content]
                text = "".join(deltas)
                (turn,) = session.turns
                # Sent as SGLang generated it (every token but the last, which may be the EOS, as it came).
                assert len(deltas) >= 2 or len(turn.output_ids) < 4, deltas
                assert text == tokenizer.decode(
                    turn.output_ids[:-1] if turn.finish_reason == "stop" else turn.output_ids
                )
                assert session.last.tokens == turn.input_ids + turn.output_ids
                session.strict = True  # --openai-strict-history
                with pytest.raises(openai.BadRequestError, match="do not extend"):
                    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "other"}])
                with pytest.raises(openai.AuthenticationError):
                    await client.with_options(api_key="wrong").models.list()
                other = await endpoint.http_client().get(f"{sglang_server.url}/get_model_info")
                assert other.status_code == 200  # not the endpoint: through the pool
                await endpoint.close_session(session.id)
                with pytest.raises(openai.NotFoundError, match="ended session"):
                    await client.models.list()
            finally:
                await endpoint.stop()
            with pytest.raises(openai.APIConnectionError):
                await client.models.list()
            assert ctx.counters["openai_unauthorized"] == 1 and ctx.counters["openai_history_mismatch"] == 1

    asyncio.run(main())


def test_an_endpoint_whose_only_user_left_while_it_started_is_stopped(tiny_qwen3: Path) -> None:
    """endpoint_for: the first sample is cancelled while the endpoint starts (a rollout abort): the start goes on,
    shielded, and what it opened is closed once it is done, not left listening."""
    from transformers import AutoTokenizer

    from rollout.openai_endpoint import endpoint_for

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3)
    flags = ["--hf-checkpoint", str(tiny_qwen3), "--prompt-data", "x.jsonl", "--rollout-batch-size", "1"]

    async def main() -> None:
        async with aiohttp.ClientSession() as http:
            ctx = RolloutContext(parse_args([*flags, "--num-rollout", "1"]), tokenizer, "", http, asyncio.Semaphore(1))

            async def sample() -> None:
                async with endpoint_for(ctx):
                    await asyncio.sleep(3600)

            task = asyncio.ensure_future(sample())
            await asyncio.sleep(0)  # it has asked for the endpoint, whose start is under way
            endpoint = ctx.plugin_state["openai_endpoint"]
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert "openai_endpoint" not in ctx.plugin_state
            for _ in range(100):
                await asyncio.sleep(0.02)
                if endpoint.starting.done() and endpoint._runner is None:
                    break
            assert endpoint.starting.done() and endpoint._runner is None  # started, then stopped

    asyncio.run(main())
