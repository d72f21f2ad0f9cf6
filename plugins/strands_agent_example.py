"""An agent built with Strands Agents (`strands-agents`), trained unchanged through the rollout's endpoint.

    --custom-generate-function-path plugins.strands_agent_example.generate --sglang-tool-call-parser qwen25

`calculator_agent` is a Strands `Agent` with one Python `@tool`, `triple(digit)`, on Strands' own OpenAI model
provider (`strands.models.openai.OpenAIModel`, streaming as it does by default) whose client is
`plugins.openai_agent.openai_client` for the sample's session: the model calls the tool, Strands runs it and sends
the result back as a `tool` message, the model answers. The sample trains on exactly the ids of both model calls
(rollout/openai_endpoint.py), never on text Strands re-serialised. slime's counterpart
(examples/strands_sglang) swaps in a Strands model class that calls SGLang directly; here Strands is untouched.

So that a small model (the tests' tiny one) follows that path, each phase is constrained with SGLang's `regex`
(the request's `extra_body`): the first call to a `triple` call in Qwen's `<tool_call>` format, and, from a Strands
hook after the tool ran, the answer to a number. With a capable model drop the regexes.
"""

from __future__ import annotations

from typing import Any

from strands import Agent, tool
from strands.hooks import AfterToolCallEvent, HookProvider, HookRegistry
from strands.models.openai import OpenAIModel

from plugins.openai_agent import openai_client, run_openai_agent
from rollout.context import RolloutContext
from slime_like.core.sample import Sample

CALL_TRIPLE = r'<tool_call>\n\{"name": "triple", "arguments": \{"digit": [1-3]\}\}\n</tool_call>'
NUMBER = r"[0-9]{1,2}"


@tool
def triple(digit: int) -> str:
    """Three times the digit.

    Args:
        digit: the digit to triple
    """
    return str(3 * int(digit))


class AnswerAfterTheTool(HookProvider):
    """Once a tool has run, constrain the next model call to a number (the agent's final answer)."""

    def __init__(self, model: OpenAIModel) -> None:
        self.model = model
        self.results: list[str] = []

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        """Watch tool calls."""
        registry.add_callback(AfterToolCallEvent, self.after_tool)

    def after_tool(self, event: AfterToolCallEvent) -> None:
        """Keep the tool's result; switch the model's regex from a tool call to a number."""
        self.results += [block["text"] for block in event.result["content"] if "text" in block]
        params = {**(self.model.get_config().get("params") or {}), "extra_body": {"regex": NUMBER}}
        self.model.update_config(params=params)


async def calculator_agent(base_url: str, api_key: str, sample: Sample) -> None:
    """Ask the Strands agent the sample's prompt; keep its answer and the tool's results for the reward."""
    model = OpenAIModel(
        client=openai_client(base_url, api_key, max_retries=0),
        model_id="policy",
        params={"max_tokens": 96, "extra_body": {"regex": CALL_TRIPLE}},
    )
    watcher = AnswerAfterTheTool(model)
    agent = Agent(
        model=model,
        tools=[triple],
        hooks=[watcher],
        callback_handler=None,  # Strands prints the stream to stdout by default
        system_prompt="Triple the digit with the triple tool, then answer with the result only.",
    )
    prompt = sample.prompt if isinstance(sample.prompt, str) else sample.prompt[-1]["content"]
    result = await agent.invoke_async(prompt)
    sample.metadata["agent_answer"] = str(result).strip()
    sample.metadata["tool_results"] = watcher.results


async def generate(ctx: RolloutContext, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """--custom-generate-function-path entry point: `calculator_agent` on each sample."""
    return await run_openai_agent(ctx, sample, sampling_params, calculator_agent)


def tool_reward(args: Any, sample: Sample) -> float:
    """1.0 when the agent's answer equals the tool's result (it used what the tool said), else 0.0."""
    results = sample.metadata.get("tool_results") or []
    return float(bool(results) and sample.metadata.get("agent_answer") == results[-1])
