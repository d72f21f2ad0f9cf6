"""The tool-calling agent example end to end on a real SGLang server, token in and token out.

The tiny random model cannot decide to call a tool, so each turn is steered with a regex (SGLang's
constrained decoding): the tokens are still sampled by the server, with its log-probs. Sample i % 4 of the
group calls the calculator, a Python loop that never ends, writes a malformed call, or calls tools until the
turn limit.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from buffer.train_data import build_train_data
from rollout.sglang_server import SGLangServer
from slime_like.core.sample import Status
from tests.integration.recorded_rollout import agent_args, recorded_rollout

PLUGIN = r"""
from plugins import tool_agent
from plugins.tools.python_sandbox import run_python

CALC = r'<tool_call>\{"name": "calculator", "arguments": \{"expression": "6\*7"\}\}</tool_call>'
LOOP = r'<tool_call>\{"name": "python", "arguments": \{"code": "while True: pass"\}\}</tool_call>'
MALFORMED = r'<tool_call>\{"name": calculator\}</tool_call>'
ANSWER = r'<answer>42</answer>'
SCRIPTS = [[CALC, ANSWER], [LOOP, ANSWER], [MALFORMED, ANSWER], [CALC]]


async def short_python(arguments):
    return await run_python(arguments["code"], timeout=1.0)


TOOLS = {**tool_agent.TOOLS, "python": short_python}


async def generate(ctx, sample, params):
    script = SCRIPTS[sample.index % 4]
    regex = lambda turn, s: {"regex": script[min(turn, len(script) - 1)]}
    return await tool_agent.run_agent(ctx, sample, params, tools=TOOLS, max_turns=3, turn_params=regex)
"""


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("agent")
    row = {"prompt": [{"role": "user", "content": "What is 6 times 7? Use a tool."}], "label": "42"}
    (root / "train.jsonl").write_text(json.dumps(row) + "\n")
    (root / "agent_under_test.py").write_text(PLUGIN)
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))
    sys.modules.pop("agent_under_test", None)


@pytest.fixture(scope="module")
def run(
    tiny_qwen3: Path, task: Path, sglang_server: SGLangServer
) -> Iterator[tuple[list[list[Any]], dict[str, Any], list[dict[str, Any]]]]:
    """One rollout of 4 agent samples; every /generate the agent sent, with its answer."""
    args = agent_args(
        tiny_qwen3, task, "agent_under_test.generate", "--label-key", "label", "--rm-type", "f1",
        samples=4, max_response_len=600,
    )  # fmt: skip
    yield recorded_rollout(args, sglang_server.url)


def turns_of(sample: Any, sent: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The requests this sample sent, in order (each turn's rid starts with sample-<index>-)."""
    return [r for r in sent if r["rid"].startswith(f"sample-{sample.index}-")]


def test_turns_are_token_in_token_out(run: Any) -> None:
    groups, _, sent = run
    for sample in groups[0]:
        turns = turns_of(sample, sent)
        assert len(turns) >= 2
        prompt = turns[0]["input_ids"]
        assert sample.tokens[: len(prompt)] == prompt and sample.prompt_length == len(prompt)
        for k in range(len(turns) - 1):
            output = [t[1] for t in turns[k]["out"]["meta_info"]["output_token_logprobs"]]
            # Turn k+1 starts with exactly turn k's tokens and what the model wrote, then the observation.
            assert (
                turns[k + 1]["input_ids"][: len(turns[k]["input_ids"]) + len(output)] == turns[k]["input_ids"] + output
            )
        last = turns[-1]["input_ids"] + [t[1] for t in turns[-1]["out"]["meta_info"]["output_token_logprobs"]]
        assert sample.tokens[: len(last)] == last
        # Only a sample stopped by the turn limit ends with an observation the model never saw.
        assert (len(sample.tokens) > len(last)) == (sample.status == Status.TRUNCATED)


def test_loss_mask_covers_exactly_the_models_tokens(run: Any) -> None:
    groups, _, sent = run
    for sample in groups[0]:
        expected_mask: list[int] = []
        expected_logprobs: list[float] = []
        position = sample.prompt_length
        for turn in turns_of(sample, sent):
            gap = len(turn["input_ids"]) - position  # observation tokens since the previous turn
            expected_mask += [0] * gap
            expected_logprobs += [0.0] * gap
            logprobs = turn["out"]["meta_info"]["output_token_logprobs"]
            expected_mask += [1] * len(logprobs)
            expected_logprobs += [t[0] for t in logprobs]
            position = len(turn["input_ids"]) + len(logprobs)
        expected_mask += [0] * (len(sample.tokens) - position)  # a last observation (turn limit)
        expected_logprobs += [0.0] * (len(sample.tokens) - position)
        assert sample.loss_mask == expected_mask and sample.rollout_log_probs == expected_logprobs
        assert len(sample.loss_mask) == sample.response_length
    data = build_train_data(groups)
    assert len(data) == 4 and all(len(m) == n for m, n in zip(data.loss_masks, data.response_lengths, strict=True))


def test_tool_outcomes_are_observed_and_counted(run: Any) -> None:
    groups, metrics, _ = run
    calc, loop, malformed, limit = groups[0]
    observation = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)
    assert observation.findall(calc.response) == ["42"]
    assert calc.status == Status.COMPLETED and re.search(r"<answer>42</answer>(<\|im_end\|>)?$", calc.response)
    assert calc.reward == 1.0  # F1 on the <answer>
    assert observation.findall(loop.response)[0].startswith("error: python code timed out after 1s")
    assert observation.findall(malformed.response)[0].startswith("error: malformed tool call")
    assert loop.status == malformed.status == Status.COMPLETED
    assert limit.status == Status.TRUNCATED and limit.metadata["turns"] == 3
    assert observation.findall(limit.response) == ["42", "42", "42"]
    assert metrics["rollout/agent_tool_calls"] == 1 + 1 + 1 + 3
    assert metrics["rollout/agent_tool_timeouts"] == 1 and metrics["rollout/agent_tool_call_malformed"] == 1
    assert metrics["rollout/agent_turn_limit"] == 1
