"""A multi-turn tool-calling generate function, token in and token out. Copy it and adapt the format and tools.

    --custom-generate-function-path plugins.tool_agent.generate

Each turn the model continues the sample's tokens until it writes a tool call
`<tool_call>{"name": "calculator", "arguments": {"expression": "2 * 21"}}</tool_call>` (a stop string), ends
its answer (EOS), or runs out of budget. A tool call is run and its output appended as an observation with
loss mask 0 (the policy did not write it); then the next turn starts. Earlier turns are never decoded and
re-encoded: the tokens sent on turn k+1 are exactly those of turn k plus the observation's tokens.

Bad input is answered, counted (`rollout/agent_*`), and the conversation goes on: malformed tool-call text,
unknown tools, tools that raise or run past their time limit. `--rollout-max-response-len` bounds the whole
response (observations included), MAX_TURNS the number of model turns.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

from plugins.tools.calculator import calculator
from plugins.tools.python_sandbox import python
from rollout.context import RolloutContext
from rollout.generate import append_model_tokens, call_model, finish_status, prompt_token_ids
from slime_like.core.sample import Sample, Status

Tool = Callable[[dict[str, Any]], Awaitable[str]]

TOOLS: dict[str, Tool] = {"calculator": calculator, "python": python}
MAX_TURNS = 4
TOOL_TIMEOUT_S = 10.0  # a backstop; the Python sandbox has its own, shorter limit
MAX_OBSERVATION_CHARS = 1024
TOOL_CALL_END = "</tool_call>"
TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
# Qwen-style chat turns: the tool output comes back as a user turn, then the assistant speaks again.
OBSERVATION = (
    "<|im_end|>\n<|im_start|>user\n<tool_response>\n{output}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
)

TurnParams = Callable[[int, Sample], dict[str, Any]]


async def run_tool_call(ctx: RolloutContext, text: str, tools: dict[str, Tool]) -> str:
    """The observation for one tool call's text (the part between the tags); errors become observations."""
    ctx.count("agent_tool_calls")
    try:
        call = json.loads(text)
        name, arguments = call["name"], call.get("arguments", {})
        if not isinstance(name, str) or not isinstance(arguments, dict):
            raise TypeError("name must be a string and arguments an object")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        ctx.count("agent_tool_call_malformed")
        return f'error: malformed tool call ({exc}); write {{"name": ..., "arguments": {{...}}}}'
    if name not in tools:
        ctx.count("agent_tool_unknown")
        return f"error: unknown tool {name!r}; tools are {sorted(tools)}"
    try:
        return await asyncio.wait_for(tools[name](arguments), TOOL_TIMEOUT_S)
    except TimeoutError as exc:
        ctx.count("agent_tool_timeouts")
        return f"error: {exc or 'tool timed out'}"
    except Exception as exc:  # a tool's failure is the model's feedback, not the rollout's crash
        ctx.count("agent_tool_errors")
        return f"error: {exc}"


def append_observation(ctx: RolloutContext, sample: Sample, output: str) -> list[int]:
    """Append a tool's output as an observation: its tokens go in with loss mask 0 and log-prob 0."""
    text = OBSERVATION.format(output=output[:MAX_OBSERVATION_CHARS])
    tokens = list(ctx.tokenizer(text, add_special_tokens=False)["input_ids"])
    sample.tokens = sample.tokens + tokens
    sample.response += text
    sample.response_length += len(tokens)
    sample.loss_mask = (sample.loss_mask or []) + [0] * len(tokens)
    sample.rollout_log_probs = (sample.rollout_log_probs or []) + [0.0] * len(tokens)
    sample.add_version_spans(len(tokens))  # no weights generated them
    return tokens


async def run_agent(
    ctx: RolloutContext,
    sample: Sample,
    sampling_params: dict[str, Any],
    *,
    tools: dict[str, Tool] = TOOLS,
    max_turns: int = MAX_TURNS,
    turn_params: TurnParams | None = None,
) -> Sample:
    """Alternate model turns and tool calls until an answer, the turn limit or the token budget.

    `turn_params(turn, sample)` may override sampling parameters per turn. A sample aborted mid-turn
    (partial rollout) resumes here later: its turn count and the start of its current turn are in metadata.
    """
    if not sample.tokens:
        sample.tokens = prompt_token_ids(ctx.tokenizer, sample.prompt)
    budget = sampling_params["max_new_tokens"]
    stops = [*(sampling_params.get("stop") or []), TOOL_CALL_END]
    while True:
        turn = sample.metadata.get("turns", 0)
        if turn >= max_turns:
            sample.status = Status.TRUNCATED
            ctx.count("agent_turn_limit")
            return sample
        left = budget - sample.response_length
        if left <= 0:
            sample.status = Status.TRUNCATED
            return sample
        sample.metadata.setdefault("turn_start", len(sample.response))
        params = {**sampling_params, "max_new_tokens": left, "stop": stops, "no_stop_trim": True}
        params.update(turn_params(turn, sample) if turn_params else {})
        out = await call_model(ctx, sample, params)
        if out is None:
            return sample  # failed or aborted; status already set
        append_model_tokens(sample, out)
        status, error = finish_status(ctx, out)
        if error:
            sample.metadata["generate_error"] = error
        if status != Status.COMPLETED:
            sample.status = status  # truncated, aborted (resumes later) or failed
            return sample
        turn_text = sample.response[sample.metadata.pop("turn_start") :]
        sample.metadata["turns"] = turn + 1
        ctx.count("agent_turns")
        call = TOOL_CALL.search(turn_text)
        if call is None:
            sample.status = Status.COMPLETED  # the model answered without calling a tool
            return sample
        append_observation(ctx, sample, await run_tool_call(ctx, call.group(1), tools))


async def generate(ctx: RolloutContext, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """--custom-generate-function-path entry point: the agent with the calculator and Python tools."""
    return await run_agent(ctx, sample, sampling_params)
