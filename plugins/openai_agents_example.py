"""An agent built with OpenAI's Agents SDK (`openai-agents`), trained unchanged through the rollout's endpoint.

    --custom-generate-function-path plugins.openai_agents_example.generate --sglang-tool-call-parser qwen25

`calculator_agent` is an SDK `Agent` with one Python tool, `double(digit)`, running on the SDK's chat-completions
model over `plugins.openai_agent.openai_client`: the model calls the tool, the SDK runs it and sends the result
back, the model answers. The sample trains on exactly the tokens of both model calls (rollout/openai_endpoint.py).

So that a small model (the tests' tiny one) follows that path, each phase is constrained with SGLang's `regex`
(`ModelSettings.extra_body`): the first call to a `double` call in Qwen's `<tool_call>` format, and, from an SDK
hook after the tool ran, the answer to a number. With a capable model drop the regexes (or use
`tool_choice="required"`, which the endpoint turns into the tool-call parser's grammar where the tokenizer has the
format's markers as special tokens). Tracing is turned off: the SDK would send spans to OpenAI's servers.
"""

from __future__ import annotations

from typing import Any, Literal

from agents import (
    Agent,
    AgentHooks,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    ToolCallOutputItem,
    function_tool,
    set_tracing_disabled,
)

from plugins.openai_agent import openai_client, run_openai_agent
from rollout.context import RolloutContext
from slime_like.core.sample import Sample

CALL_DOUBLE = r'<tool_call>\n\{"name": "double", "arguments": \{"digit": "[1-4]"\}\}\n</tool_call>'
NUMBER = r"[0-9]{1,2}"


@function_tool
def double(digit: Literal["1", "2", "3", "4"]) -> str:
    """Twice the digit."""
    return str(2 * int(digit))


class AnswerAfterTheTool(AgentHooks):
    """Once a tool has run, constrain the next model call to a number (the agent's final answer)."""

    async def on_tool_end(self, context: Any, agent: Agent, tool: Any, result: str) -> None:
        """Switch the agent's regex from a tool call to a number."""
        agent.model_settings = agent.model_settings.resolve(ModelSettings(extra_body={"regex": NUMBER}))


async def calculator_agent(base_url: str, api_key: str, sample: Sample) -> None:
    """Ask the SDK agent the sample's prompt; keep its answer and the tool's results for the reward."""
    set_tracing_disabled(True)
    model = OpenAIChatCompletionsModel(model="policy", openai_client=openai_client(base_url, api_key, max_retries=0))
    agent = Agent(
        name="calculator",
        instructions="Double the digit with the double tool, then answer with the result only.",
        tools=[double],
        model=model,
        model_settings=ModelSettings(max_tokens=96, extra_body={"regex": CALL_DOUBLE}),
        hooks=AnswerAfterTheTool(),
    )
    prompt = sample.prompt if isinstance(sample.prompt, str) else sample.prompt[-1]["content"]
    result = await Runner.run(agent, input=prompt, max_turns=3)
    sample.metadata["agent_answer"] = str(result.final_output)
    sample.metadata["tool_results"] = [item.output for item in result.new_items if isinstance(item, ToolCallOutputItem)]


async def generate(ctx: RolloutContext, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """--custom-generate-function-path entry point: `calculator_agent` on each sample."""
    return await run_openai_agent(ctx, sample, sampling_params, calculator_agent)


def tool_reward(args: Any, sample: Sample) -> float:
    """1.0 when the agent's answer equals the tool's result (it used what the tool said), else 0.0."""
    results = sample.metadata.get("tool_results") or []
    return float(bool(results) and sample.metadata.get("agent_answer") == results[-1])
