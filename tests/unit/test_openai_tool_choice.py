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
