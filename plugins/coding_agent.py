"""Coding-agent CLIs (Claude Code, Codex) trained on repository tasks, each sample in a local sandbox.

    --custom-generate-function-path plugins.coding_agent.generate --custom-rm-path plugins.coding_agent.test_reward

A row's metadata names the task: `repo` (a host directory, copied per sample), `workdir` (where the copy is in the
sandbox, default /testbed), `test_cmd` (run in the sandbox after the agent: exit 0 = solved) and optionally `agent`
(claude_code or codex; default `--custom-config-path`'s `coding_agent`, else $SWE_AGENT, else claude_code) and
`cli_args` (added to the CLI's command line, e.g. a shorter system prompt for a small model). The prompt is the task.

Per sample: a LocalSandbox (plugins/local_sandbox.py) whose only way out is the session's endpoint port; the CLI
(plugins/agent_harness.py, unchanged binaries from scripts/setup-coding-agents.sh) is pointed at that sample's
session of the rollout's endpoint: Claude Code speaks Anthropic Messages (`/s/<sid>/v1/messages`), Codex the
Responses API (`/s/<sid>/v1/responses`); the sample trains on the ids the engines received and sampled
(plugins/openai_agent.py; a history the CLI rewrote branches the session: one more sample per branch). Then the
task's test runs in the same sandbox; `test_reward` is its result (1.0 when it passes). What happened is in
`sample.metadata["coding_agent"]`: agent, exit_code (-1: its time budget ran out), tests_passed, test_output (tail),
diff (what the agent changed in a git workdir, before the test ran; tail), sandbox_s (start), agent_s, launched_at
(time.monotonic() when the CLI was started: for start-up figures).
"""

from __future__ import annotations

import os
import time
from typing import Any
from urllib.parse import urlsplit

from plugins.agent_harness import BaseHarness, ClaudeCodeHarness, CodexHarness
from plugins.agent_sandbox import LOCAL_WORKDIR, local_sandbox
from plugins.openai_agent import run_openai_agent
from rollout.context import RolloutContext
from slime_like.core.sample import Sample

RESULT_KEY = "coding_agent"
HARNESSES: dict[str, type[BaseHarness]] = {"claude_code": ClaudeCodeHarness, "codex": CodexHarness}
TIME_BUDGET_S = 600
TEST_TIMEOUT_S = 300
DIFF_CMD = "git add -N . 2>/dev/null && git diff -- . ':(exclude).harness/' 2>/dev/null"  # what the agent changed
DIFF_BYTES = 16384


def harness_for(name: str) -> BaseHarness:
    """The harness named `name`; ValueError naming the choices."""
    if name not in HARNESSES:
        raise ValueError(f"coding agent {name!r}: expected one of {sorted(HARNESSES)}")
    return HARNESSES[name]()


def task_of(sample: Sample, default_agent: str) -> dict[str, Any]:
    """The sample's task from its metadata, checked (ValueError naming the missing key)."""
    md = sample.metadata or {}
    for key in ("repo", "test_cmd"):
        if not md.get(key):
            raise ValueError(f"plugins.coding_agent: sample {sample.index} has no metadata[{key!r}]")
    prompt = sample.prompt if isinstance(sample.prompt, str) else "\n\n".join(str(m.get("content", "")) for m in sample.prompt)  # fmt: skip
    return {"repo": md["repo"], "workdir": md.get("workdir") or LOCAL_WORKDIR, "test_cmd": md["test_cmd"],
            "agent": md.get("agent") or default_agent, "cli_args": md.get("cli_args") or "", "prompt": prompt}  # fmt: skip


async def run_task(task: dict[str, Any], base_url: str, api_key: str, time_budget_s: float) -> dict[str, Any]:
    """One task in a fresh sandbox: the CLI against the session at `base_url`, then the task's test."""
    harness = harness_for(task["agent"])
    port = urlsplit(base_url).port
    start = time.monotonic()
    async with local_sandbox(task["repo"], task["workdir"], bridge=[port] if port else []) as sb:
        await harness.install_cli(sb)
        sandbox_s = time.monotonic() - start
        launched_at = time.monotonic()
        exit_code = await harness.run(
            sb, workdir=task["workdir"], session_id=urlsplit(base_url).path.split("/")[2],
            adapter_url=base_url.removesuffix("/v1"), time_budget_sec=int(time_budget_s), prompt=task["prompt"],
            api_key=api_key, extra_args=task["cli_args"],
        )  # fmt: skip
        agent_s = time.monotonic() - launched_at
        _, diff, _ = await sb.exec(DIFF_CMD, cwd=task["workdir"], timeout=60)
        rc, out, err = await sb.exec(task["test_cmd"], cwd=task["workdir"], timeout=TEST_TIMEOUT_S)
        _, log, _ = await sb.exec(f"tail -c 4096 {task['workdir']}/.harness/trajectory.jsonl 2>/dev/null")
    return {"agent": task["agent"], "exit_code": exit_code, "tests_passed": rc == 0, "test_exit_code": rc,
            "test_output": (out + err)[-2048:], "agent_output": log, "sandbox_s": round(sandbox_s, 3),
            "agent_s": round(agent_s, 3), "launched_at": launched_at, "diff": diff[-DIFF_BYTES:]}  # fmt: skip


async def generate(ctx: RolloutContext, sample: Sample, sampling_params: dict[str, Any]) -> Sample | list[Sample]:
    """--custom-generate-function-path entry point: the sample's coding agent in a sandbox, its calls the trajectory."""
    default_agent = getattr(ctx.args, "coding_agent", None) or os.environ.get("SWE_AGENT") or "claude_code"
    task = task_of(sample, default_agent)
    harness_for(task["agent"])  # a wrong name stops the run here, not as a failed sample
    budget = float(getattr(ctx.args, "coding_agent_time_budget", None) or TIME_BUDGET_S)

    async def agent(base_url: str, api_key: str, sample: Sample) -> None:
        sample.metadata.pop(RESULT_KEY, None)
        sample.metadata[RESULT_KEY] = await run_task(task, base_url, api_key, budget)
        ctx.count(f"coding_agent_{task['agent']}_runs")

    return await run_openai_agent(ctx, sample, sampling_params, agent, timeout=budget + TEST_TIMEOUT_S + 60)


def test_reward(args: Any, sample: Sample) -> float:
    """--custom-rm-path: 1.0 when the task's test passed in the sandbox after the agent, else 0.0."""
    return float(bool((sample.metadata.get(RESULT_KEY) or {}).get("tests_passed")))
