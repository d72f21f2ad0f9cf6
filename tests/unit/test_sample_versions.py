"""Per-span weight versions: Sample.version_spans filled from /generate answers (plain and streamed), tool tokens,
slime's append path, round trips; and the assembly of a streamed answer from its server-sent events."""

from __future__ import annotations

import asyncio
import json
from argparse import Namespace
from collections.abc import AsyncIterator

import pytest

from rollout.generate import append_model_tokens
from rollout.pause import server_args, streams_versions
from rollout.sglang_stream import GenerateRefused, read_stream
from slime_like.core import slime_finder
from slime_like.core.errors import EngineError
from slime_like.core.sample import VERSION_SPANS_KEY

slime_finder.install()
from slime.utils.types import Sample  # noqa: E402  (ours with slime's append_response_tokens)


def answer(tokens: list[int], version: str, spans: list[list] | None = None) -> dict:
    """A /generate answer as SGLang shapes it (log-prob -0.5 per token), optionally with streamed spans."""
    meta = {
        "output_token_logprobs": [[-0.5, t, None] for t in tokens],
        "weight_version": version,
        "finish_reason": {"type": "length"},
    }
    if spans is not None:
        meta[VERSION_SPANS_KEY] = spans
    return {"text": "x" * len(tokens), "output_ids": tokens, "meta_info": meta}


def prompt_sample() -> Sample:
    return Sample(prompt="p", tokens=[1, 2, 3], index=0)


def test_plain_answers_record_one_span_each_merging_equal_versions() -> None:
    sample = prompt_sample()
    append_model_tokens(sample, answer([5, 6], "3"))
    append_model_tokens(sample, answer([7], "3"))
    append_model_tokens(sample, answer([8, 9, 10], "4"))
    assert sample.version_spans == [[3, 3], [4, 3]]
    assert sample.oldest_version() == 3
    assert sample.weight_version == 4  # as before: the last answer's version
    assert sum(n for _, n in sample.version_spans) == sample.response_length == 6


def test_streamed_spans_give_each_token_its_version() -> None:
    sample = prompt_sample()
    append_model_tokens(sample, answer([5, 6], "1"))
    append_model_tokens(sample, answer([7, 8, 9, 10], "3", spans=[["1", 1], ["2", 2], ["3", 1]]))
    assert sample.version_spans == [[1, 3], [2, 2], [3, 1]]
    assert sample.oldest_version() == 1
    assert sample.weight_version == 3


def test_streamed_spans_that_do_not_cover_the_tokens_fall_back_to_the_final_version() -> None:
    sample = prompt_sample()
    sample.append_response_tokens(tokens=[5, 6], log_probs=[-1.0, -1.0], meta_info={VERSION_SPANS_KEY: [["1", 3]]})
    sample.append_response_tokens(
        tokens=[7], log_probs=[-1.0], meta_info={VERSION_SPANS_KEY: [["1", 3]], "weight_version": "2"}
    )
    assert sample.version_spans == [[-1, 2], [2, 1]]  # no version at all, then the answer's final one


def test_tool_tokens_are_covered_with_no_version_and_never_the_oldest() -> None:
    sample = prompt_sample()
    append_model_tokens(sample, answer([5, 6], "7"))
    sample.append_response_tokens(tokens=[40, 41, 42], trainable=False)  # a tool's output (slime's helper)
    sample.append_response_tokens(
        tokens=[9], log_probs=[-0.1], meta_info={"weight_version": "8", "finish_reason": {"type": "stop"}}
    )
    assert sample.version_spans == [[7, 2], [-1, 3], [8, 1]]
    assert sample.loss_mask == [1, 1, 0, 0, 0, 1]
    assert sample.oldest_version() == 7
    assert sample.weight_versions == ["8"] and sample.weight_version == 8  # slime's list: terminal answers only


def test_oldest_version_is_none_without_a_versioned_span() -> None:
    assert Sample().oldest_version() is None
    sample = prompt_sample()
    sample.add_version_spans(4)
    sample.add_version_spans(0, {"weight_version": "3"})  # no tokens: no span
    assert sample.version_spans == [[-1, 4]] and sample.oldest_version() is None
    append_model_tokens(sample, answer([5], "default"))  # a server never tagged with a number
    assert sample.version_spans == [[-1, 5]] and sample.weight_version is None


def test_spans_round_trip_through_a_dict_and_json() -> None:
    sample = prompt_sample()
    append_model_tokens(sample, answer([5, 6, 7], "2", spans=[["1", 2], ["2", 1]]))
    back = Sample.from_dict(json.loads(json.dumps(sample.to_dict())))
    assert back.version_spans == [[1, 2], [2, 1]] and back.oldest_version() == 1
    assert back == sample
    assert Sample.from_dict({"prompt": "p"}).version_spans == []  # a sample saved before the field existed


def test_version_spans_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        Sample("p", [1], "", 0, None, None, None, None, "pending", {}, None, None, None, [[1, 1]])


# --- streamed answers -------------------------------------------------------------------------------------------


def event(chunk: dict | str) -> bytes:
    return b"data: " + (chunk.encode() if isinstance(chunk, str) else json.dumps(chunk).encode()) + b"\n\n"


def chunk(ids: list[int], total: int, version: str, finish: str | None = None, text: str = "") -> dict:
    """One streamed chunk: `ids` (all tokens so far, or only the new ones) with their log-probs (-token id)."""
    meta = {
        "completion_tokens": total,
        "weight_version": version,
        "output_token_logprobs": [[-float(t), t, None] for t in ids],
        "finish_reason": {"type": finish} if finish else None,
    }
    return {"text": text, "output_ids": ids, "meta_info": meta}


async def pieces(data: bytes, size: int) -> AsyncIterator[bytes]:
    """The bytes as the network may cut them."""
    for start in range(0, len(data), size):
        yield data[start : start + size]


def read(events: list[bytes], size: int = 7) -> dict:
    return asyncio.run(read_stream(pieces(b"".join(events), size), "http://server/generate"))


@pytest.mark.parametrize("size", [1, 7, 10_000])
def test_whole_answer_chunks_give_spans_at_the_version_changes(size: int) -> None:
    """SGLang's default: each chunk repeats every token so far."""
    events = [
        event(chunk([10], 1, "1", text="a")),
        event(chunk([10, 11, 12], 3, "1", text="abc")),
        event(chunk([10, 11, 12, 13], 4, "2", text="abcd")),
        event(chunk([10, 11, 12, 13, 14], 5, "2", finish="length", text="abcde")),
        event("[DONE]"),
    ]
    out = read(events, size)
    assert out["output_ids"] == [10, 11, 12, 13, 14] and out["text"] == "abcde"
    assert [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]] == [-10, -11, -12, -13, -14]
    assert out["meta_info"][VERSION_SPANS_KEY] == [["1", 3], ["2", 2]]
    assert out["meta_info"]["finish_reason"] == {"type": "length"}


def test_incremental_chunks_are_joined() -> None:
    """--incremental-streaming-output: each chunk holds only its new tokens (here two chunks coalesced into one)."""
    events = [
        event(chunk([10, 11], 2, "4", text="ab")),
        event(chunk([12], 3, "4", text="c")),
        event(chunk([13, 14], 5, "5", text="de")),
        event(chunk([], 5, "5", finish="abort")),
        event("[DONE]"),
    ]
    out = read(events)
    assert out["output_ids"] == [10, 11, 12, 13, 14] and out["text"] == "abcde"
    assert [t for _, t, _ in out["meta_info"]["output_token_logprobs"]] == [10, 11, 12, 13, 14]
    assert out["meta_info"][VERSION_SPANS_KEY] == [["4", 3], ["5", 2]]
    sample = prompt_sample()
    append_model_tokens(sample, out)
    assert sample.version_spans == [[4, 3], [5, 2]] and sample.tokens[3:] == [10, 11, 12, 13, 14]


def test_a_broken_or_unfinished_stream_is_an_engine_error() -> None:
    with pytest.raises(EngineError, match="http://server/generate: the stream ended before its"):
        read([event(chunk([10], 1, "1"))])
    with pytest.raises(EngineError, match="ended before the request finished"):
        read([event(chunk([10], 1, "1")), event("[DONE]")])
    with pytest.raises(EngineError, match="does not lead to its count of 5"):
        read([event(chunk([10], 1, "1")), event(chunk([11], 5, "1"))])


def test_a_streamed_error_names_its_kind() -> None:
    refused = {"error": {"message": "prompt too long", "code": 400}}
    with pytest.raises(GenerateRefused, match="prompt too long"):
        read([event(refused), event("[DONE]")])
    with pytest.raises(EngineError, match="scheduler died") as error:
        read([event({"error": {"message": "scheduler died", "code": 500}}), event("[DONE]")])
    assert not isinstance(error.value, GenerateRefused)


def test_only_runs_that_keep_requests_across_updates_stream() -> None:
    assert not streams_versions(Namespace())
    assert not streams_versions(Namespace(fully_async=True, pause_generation_mode="abort"))
    assert not streams_versions(Namespace(fully_async=False, pause_generation_mode="in_place"))
    assert streams_versions(Namespace(fully_async=True, pause_generation_mode="retract"))
    assert streams_versions(Namespace(fully_async=True, pause_generation_mode="in_place"))
    assert server_args("abort") == []
    assert "--disable-overlap-schedule" in server_args("in_place")
    assert "--disable-overlap-schedule" not in server_args("retract")
    with pytest.raises(ValueError, match="'drain' is not one of abort, retract, in_place"):
        server_args("drain")


def test_a_tool_observation_is_covered_with_no_version() -> None:
    from plugins.tool_agent import append_observation

    class Tokenizer:
        def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
            return {"input_ids": [100 + i for i in range(len(text.split()))]}

    sample = prompt_sample()
    append_model_tokens(sample, answer([5, 6], "2"))
    tokens = append_observation(Namespace(tokenizer=Tokenizer()), sample, "x = 4")
    assert sample.version_spans == [[2, 2], [-1, len(tokens)]]
    assert sum(n for _, n in sample.version_spans) == sample.response_length
