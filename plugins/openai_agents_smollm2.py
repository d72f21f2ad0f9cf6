"""A real pretrained model as an OpenAI Agents SDK agent with a real tool: SmolLM2-135M-Instruct and a calculator.

    --custom-generate-function-path plugins.openai_agents_smollm2.generate
    --custom-rm-path plugins.openai_agents_smollm2.reward --sglang-tool-call-parser hermes

(scripts/agent_smollm2_cpu.py runs it end to end and prints what the agent did.) The agent is an SDK `Agent` with
one `function_tool`, `calculator(expression)`, which evaluates arithmetic with plugins/tools/calculator.py; the SDK
runs it on the model's arguments and sends the result back, and the model writes the final answer.

SmolLM2-135M-Instruct's chat template has no tools: it renders `role` and `content` only, so a tool call would
vanish from the history and SGLang has no parser made for it. `with_tool_template` gives the checkpoint a ChatML
template in the Hermes tool format (tools listed in the system turn, a call as `<tool_call>\n{json}\n</tool_call>`,
a result as a `tool` turn in `<tool_response>`), parsed by SGLang's `hermes` parser. The tokens are SmolLM2's own
(`<tool_call>` is plain text to its tokenizer, not a special token), and a 135M model does not write that format by
itself, so the call turn is constrained with SGLang's `regex` to a well-formed calculator call: the model still
chooses the expression; the answer turn after the tool is free text.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from agents import (
    Agent,
    AgentHooks,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    ToolCallItem,
    ToolCallOutputItem,
    function_tool,
    set_tracing_disabled,
)

from plugins.openai_agent import openai_client, run_openai_agent
from plugins.tool_chat_template import chatml_tool_template
from plugins.tools.calculator import CalculatorError, evaluate
from rollout.context import RolloutContext
from slime_like.core.sample import Sample

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"  # SmolLM2's own default
# ChatML (SmolLM2's markers) with Hermes-style tools; an assistant call renders as the regex below samples it.
TOOL_TEMPLATE = chatml_tool_template(
    "{%- set system = messages[0].content if messages and messages[0].role == 'system' else '" + SYSTEM + "' %}"
    """<|im_start|>system
{{ system }}
{%- if tools %}

You can call these functions. Call one as <tool_call>
{"name": NAME, "arguments": ARGUMENTS}
</tool_call>
<tools>
{% for t in tools %}{{ t | tojson }}
{% endfor %}</tools>
{%- endif %}<|im_end|>
""",
    tool_role="tool",
    system_in_head=True,
)
EXPRESSION = r"[0-9]{1,4} ?[-+*/] ?[0-9]{1,4}"
CALL = r'<tool_call>\n\{"name": "calculator", "arguments": \{"expression": "' + EXPRESSION + r'"\}\}\n</tool_call>'
INSTRUCTIONS = "Use the calculator tool for arithmetic, then state the result in one short sentence."


def with_tool_template(checkpoint: str | Path, out: str | Path) -> Path:
    """A copy of `checkpoint` (its files linked, not copied) whose chat template renders tools: `out`."""
    src, out = Path(checkpoint), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.is_file() and item.name != "chat_template.jinja":
            target = out / item.name
            if not target.exists():
                try:
                    target.hardlink_to(item)
                except OSError:  # another file system
                    shutil.copy(item, target)
    (out / "chat_template.jinja").write_text(TOOL_TEMPLATE)
    _byte_level_decoder(out / "tokenizer.json")
    return out


def _byte_level_decoder(path: Path) -> None:
    """Give a GGUF-converted byte-level BPE tokenizer the plain ByteLevel decoder of SmolLM2's release.

    transformers' GGUF conversion writes a decoder sequence (ByteFallback, Fuse, Replace, ByteLevel); SGLang's
    llguidance grammar backend then reads byte-level tokens such as `Ċ` (newline) as literal text, and the first
    regex that forces a newline kills the server ("token "Ċ" doesn't satisfy the grammar"). Decoded text is the
    same either way for this vocabulary (no byte-fallback tokens, no `▁`)."""
    tokenizer = json.loads(path.read_text())
    decoders = (tokenizer.get("decoder") or {}).get("decoders") or []
    byte_level = [d for d in decoders if d.get("type") == "ByteLevel"]
    if byte_level:
        tokenizer["decoder"] = byte_level[0]
        path.unlink()  # a link to the source checkpoint's file: write a file of our own
        path.write_text(json.dumps(tokenizer, ensure_ascii=False))


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression (numbers, + - * / and parentheses).

    Args:
        expression: the expression, e.g. "17 * 23"
    """
    try:
        value = evaluate(expression)
    except CalculatorError as exc:
        return f"error: {exc}"
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


class FreeAfterTheTool(AgentHooks):
    """Once the tool has run, lift the call's regex: the model answers in its own words."""

    async def on_tool_end(self, context: Any, agent: Agent, tool: Any, result: str) -> None:
        """Drop the regex for the answer turn."""
        agent.model_settings = ModelSettings(max_tokens=agent.model_settings.max_tokens, extra_body={})


async def smollm2_agent(base_url: str, api_key: str, sample: Sample) -> None:
    """Ask the SDK agent the sample's question; keep its tool calls, the tool's results and its answer."""
    set_tracing_disabled(True)  # the SDK would send spans to OpenAI's servers
    model = OpenAIChatCompletionsModel(model="policy", openai_client=openai_client(base_url, api_key, max_retries=0))
    agent = Agent(
        name="calculator",
        instructions=INSTRUCTIONS,
        tools=[calculator],
        model=model,
        model_settings=ModelSettings(max_tokens=48, extra_body={"regex": CALL}),
        hooks=FreeAfterTheTool(),
    )
    prompt = sample.prompt if isinstance(sample.prompt, str) else sample.prompt[-1]["content"]
    result = await Runner.run(agent, input=prompt, max_turns=3)
    items = result.new_items
    sample.metadata["agent_answer"] = str(result.final_output)
    sample.metadata["tool_calls"] = [
        {"name": item.raw_item.name, "arguments": item.raw_item.arguments} for item in items if isinstance(item, ToolCallItem)
    ]  # fmt: skip
    sample.metadata["tool_results"] = [str(item.output) for item in items if isinstance(item, ToolCallOutputItem)]
    sample.metadata["agent_messages"] = result.to_input_list()  # the conversation as the SDK holds it


async def generate(ctx: RolloutContext, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """--custom-generate-function-path entry point: `smollm2_agent` on each sample."""
    return await run_openai_agent(ctx, sample, sampling_params, smollm2_agent)


def reward(args: Any, sample: Sample) -> float:
    """1.0 when the final answer states the label (the true result), 0.5 when only the tool got it, else 0.0."""
    label = str(sample.label)
    numbers = re.findall(r"-?\d+(?:\.\d+)?", str(sample.metadata.get("agent_answer", "")).replace(",", ""))
    if label in numbers:
        return 1.0
    return 0.5 if label in (sample.metadata.get("tool_results") or []) else 0.0
