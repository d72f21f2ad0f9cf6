"""A forced tool choice (`required` or a named function) is checked before it reaches SGLang: its grammar needs the
tool-call tag as one special token of the tokenizer (rollout.openai_chat.tool_constraint)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout.openai_chat import tool_constraint
from rollout.openai_session import EndpointError

ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}  # fmt: skip


def qwen25_parser():  # noqa: ANN201  (SGLang's FunctionCallParser)
    from sglang.srt.entrypoints.openai.protocol import Tool
    from sglang.srt.function_call.function_call_parser import FunctionCallParser

    return FunctionCallParser([Tool(**ADD)], "qwen25")


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_a_tag_the_tokenizer_splits_is_a_400_naming_it(tiny_qwen3: Path, choice: object) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3)  # its own BPE: "<tool_call>" is 9 tokens
    with pytest.raises(EndpointError, match=r"'<tool_call>' to be one special token.*splits it into 9 tokens") as err:
        tool_constraint(qwen25_parser(), choice, tokenizer)
    assert err.value.status == 400


def test_a_tag_that_is_a_special_token_gets_the_parser_s_grammar(tiny_qwen3: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
    (kind, grammar) = tool_constraint(qwen25_parser(), "required", tokenizer).popitem()
    assert kind == "structural_tag" and '"triggers": ["<tool_call>"]' in grammar and '"at_least_one": true' in grammar
    assert tool_constraint(qwen25_parser(), "auto", tokenizer) == {}


def test_a_streamed_turn_s_text_is_the_reply_held_back_only_where_it_must(tiny_qwen3: Path) -> None:
    """TextFeed (rollout.openai_chat): the deltas, as the ids come one by one, add up to the reply; the last id (maybe
    the EOS) and text that could still open a tool call are held back until the turn ends."""
    import asyncio

    from transformers import AutoTokenizer

    from rollout.openai_chat import TextFeed

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3)
    reply = "Hello wörld, 3+3=6 ✓ done"
    ids = tokenizer(reply, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]

    class Stream:
        def __init__(self) -> None:
            self.deltas: list[str] = []
            self.finished = False

        async def text(self, delta: str) -> None:
            self.deltas.append(delta)

        async def finish(self, answer: dict) -> None:
            self.finished = True

    async def run(parser: object) -> Stream:
        stream = Stream()
        feed = TextFeed(tokenizer, stream, {}, parser)
        for i in ids:
            await feed.add([i])
        before_end = "".join(stream.deltas)
        assert reply.startswith(before_end) and "<|im_end|>" not in before_end
        await feed.finish(reply, {})
        assert "".join(stream.deltas) == reply and stream.finished
        return stream

    plain = asyncio.run(run(None))
    assert len(plain.deltas) > len(ids) // 2  # streamed as the ids came, not at the end
    tools = asyncio.run(run(qwen25_parser()))  # "<tool_call>" is 11 characters: the last 11 wait for the end
    assert len("".join(tools.deltas[:-1])) <= len(reply) - 11
