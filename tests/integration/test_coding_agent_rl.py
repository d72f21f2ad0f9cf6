"""slime's examples/coding_agent_rl run unchanged: its generate.py and swe.py, copied verbatim into
slime_plugins/coding_agent_rl/, drive one rollout with Claude Code (SWE_AGENT=claude_code, AnthropicAdapter) and one
with Codex (SWE_AGENT=codex, OpenAIAdapter's /v1/responses), in local sandboxes (SLIME_AGENT_SANDBOX=local) whose
"image" is a host git repository with a failing unit test, on the tiny 32k-context model. The random model fixes
nothing: the reward is 0, as the example's own evaluation (a clean sandbox, the agent's diff, the row's eval_cmd)
says. The test is the plumbing: every call the CLI made reached the engines, samples are token-exact, the sandbox
reaches the adapter and nothing else."""

from __future__ import annotations

import asyncio
import importlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from plugins.agent_sandbox import E2BSandbox
from rollout.sglang_server import SGLangServer
from slime_like.core import slime_finder
from slime_like.core.sample import Status
from tests.integration.recorded_rollout import agent_args, recorded_rollout
from tests.integration.test_coding_agents import CLAUDE_ARGS, CODEX_ARGS, MISSING, _repo, _sampled

pytestmark = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))

HERE = Path(__file__).resolve().parent
EXAMPLE = "slime_plugins.coding_agent_rl"
PROBLEM = "`calc.add(2, 3)` returns -1, not 5, so `python3 -m unittest` fails in test_calc.py. Fix calc.py."
# The example's knobs (read when it is imported): the sandbox on this machine, the adapter on 127.0.0.1 (the local
# sandbox bridges its port), short budgets, and the CLIs' short system prompts through the harness's extra args.
ENV = {
    "SLIME_AGENT_SANDBOX": "local",
    "ADAPTER_PUBLIC_HOST": "127.0.0.1",
    "ADAPTER_BIND_HOST": "127.0.0.1",
    "ADAPTER_PORT": "0",
    "SWE_AGENT_TIME_BUDGET_SEC": "240",
    "SWE_EVAL_TIMEOUT_SEC": "60",
    "SLIME_AGENT_CC_EXTRA_ARGS": CLAUDE_ARGS,
    "SLIME_AGENT_CODEX_EXTRA_ARGS": CODEX_ARGS,
}
PROBE = 'python3 -c \'import socket; socket.create_connection(("{}", {}), timeout=3); print("reached")\' 2>&1 | tail -1'


def _forget_example() -> None:
    for name in [m for m in sys.modules if m == EXAMPLE or m.startswith(f"{EXAMPLE}.")]:
        del sys.modules[name]


def _recording(fn: Any, into: list[Any]) -> Any:
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = await fn(*args, **kwargs)
        into.append(result)
        return result

    return wrapper


def _diff_and_log(git_diff: Any, diffs: list[str], logs: list[str]) -> Any:
    """swe.git_diff, recording the diff and the CLI's output (the harness's .harness/trajectory.jsonl) too."""

    async def wrapper(sb: Any, workdir: str) -> str:
        logs.append(await sb.read_file(f"{workdir}/.harness/trajectory.jsonl"))
        diffs.append(await git_diff(sb, workdir))
        return diffs[-1]

    return wrapper


async def _probe(image: str, adapter_port: int, engine_port: int) -> dict[str, str]:
    """From a sandbox made as the example makes them: the adapter's health, the engine's port, the outside."""
    health = f"python3 -c 'import urllib.request as u; print(u.urlopen(\"http://127.0.0.1:{adapter_port}/healthz\").read().decode())'"  # noqa: E501
    async with E2BSandbox(image) as sb:
        return {
            "adapter": (await sb.exec(health))[1].strip(),
            "engine": (await sb.exec(PROBE.format("127.0.0.1", engine_port)))[1],
            "outside": (await sb.exec(PROBE.format("1.1.1.1", 80)))[1],
        }


@pytest.fixture(scope="module", params=["claude_code", "codex"])
def run(
    request: pytest.FixtureRequest,
    long_tiny_qwen3: Path,
    long_sglang_server: SGLangServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Any:
    """One rollout of one SWE row through the example with the agent `request.param`; what it sent and got."""
    agent = request.param
    root = tmp_path_factory.mktemp(f"coding-agent-rl-{agent}")
    repo = _repo(root)
    image = f"{repo}:/testbed"
    row = {
        "prompt": PROBLEM,
        "label": "calc-1",
        "metadata": {"instance_id": "calc-1", "image": image, "workdir": "/testbed", "problem_statement": PROBLEM,
                     "eval_cmd": "python3 -m unittest"},
    }  # fmt: skip
    (root / "train.jsonl").write_text(json.dumps(row) + "\n")
    args = agent_args(
        long_tiny_qwen3, root, f"{EXAMPLE}.generate.generate", "--label-key", "label", "--metadata-key", "metadata",
        "--rollout-max-context-len", "30000", "--sglang-tool-call-parser", "qwen25", samples=1, max_response_len=256,
    )  # fmt: skip
    slime_finder.install()
    from slime.agent.adapters.common import BaseAdapter
    from slime.utils.misc import SingletonMeta

    calls: list[tuple[str, int]] = []  # every request the adapter answered: (path, status)
    original = BaseAdapter._handle

    async def handle(self: Any, req: Any, respond: Any, handler: Any = None) -> Any:
        response = await original(self, req, respond, handler)
        calls.append((req.path, response.status))
        return response

    diffs: list[str] = []
    logs: list[str] = []
    evals: list[Any] = []
    engine_port = int(long_sglang_server.url.rsplit(":", 1)[1])
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {**ENV, "SWE_AGENT": agent}.items():
            mp.setenv(key, value)
        mp.syspath_prepend(str(HERE))
        _forget_example()
        example = importlib.import_module(f"{EXAMPLE}.generate")  # reads SWE_AGENT and its knobs, as in slime
        mp.setattr(example.swe, "git_diff", _diff_and_log(example.swe.git_diff, diffs, logs))
        mp.setattr(example.swe, "run_evaluation", _recording(example.swe.run_evaluation, evals))
        mp.setattr(BaseAdapter, "_handle", handle)
        start = time.monotonic()
        groups, metrics, sent = recorded_rollout(args, long_sglang_server.url)
        seconds = time.monotonic() - start
        service = SingletonMeta._instances.pop(example._AdapterService)
        probe = asyncio.run(_probe(image, service.app_handle.port, engine_port))
        service.app_handle.stop()
        _forget_example()
    print(
        f"[figure] coding_agent_rl {agent}: rollout {seconds:.1f} s (10 s of it the example's sleep), {len(sent)} calls"
    )  # noqa: E501
    return SimpleNamespace(agent=agent, repo=repo, groups=groups, metrics=metrics, sent=sent, calls=calls, diffs=diffs,
                           evals=evals, logs=logs, probe=probe, adapter=type(service.adapter).__name__)  # fmt: skip


def test_every_call_reached_the_engines_and_samples_are_token_exact(run: Any) -> None:
    samples = [s for g in run.groups for s in g]
    assert run.adapter == {"claude_code": "AnthropicAdapter", "codex": "OpenAIAdapter"}[run.agent]
    path = {"claude_code": "/v1/messages", "codex": "/v1/responses"}[run.agent]
    answered = [c for c in run.calls if c[1] == 200]
    assert answered and {p for p, _ in answered} == {path}, (run.calls, run.logs)
    # Each call the CLI made that the adapter answered is one /generate of the engines, and nothing else was sent;
    # a call after the sample's response budget is spent is refused (400: Claude Code tries once more) unsent.
    assert len(answered) == len(run.sent) == run.metrics["rollout/openai_turns"]
    refused = [c for c in run.calls if c[1] != 200]
    assert all(status == 400 for _, status in refused) and (not refused or samples[-1].status == Status.TRUNCATED)
    assert len(samples) == 1 + run.metrics.get("rollout/openai_branches", 0)  # one sample per branch
    for sample in samples:
        assert sample.status in (Status.COMPLETED, Status.TRUNCATED), sample.metadata
        assert sample.metadata["instance_id"] == "calc-1" and "agent_exit_code" in sample.metadata
        # Token in, token out: the last call's ids plus what SGLang sampled; the trained ids are the sampled ids.
        (last,) = [t for t in run.sent if t["input_ids"] + _sampled(t)[0] == sample.tokens]
        ids, lps = _sampled(last)
        assert sample.loss_mask[-len(ids) :] == [1] * len(ids) and sample.rollout_log_probs[-len(ids) :] == lps
        trained = [t for t, m in zip(sample.tokens[sample.prompt_length :], sample.loss_mask, strict=True) if m]
        own = sorted(
            (t for t in run.sent if sample.tokens[: len(t["input_ids"])] == t["input_ids"]),
            key=lambda t: len(t["input_ids"]),
        )  # noqa: E501
        assert trained == [i for t in own for i in _sampled(t)[0]][-len(trained) :]


def test_the_reward_is_the_examples_evaluation(run: Any, tmp_path: Path) -> None:
    samples = [s for g in run.groups for s in g]
    (diff,), (result,) = run.diffs, run.evals
    assert all(s.reward == result.reward for s in samples) and result.reward == 0.0
    assert all(s.metadata["grading_solved"] is False for s in samples)
    # The same grading on this host: the agent's diff applied to a clean copy, the row's eval_cmd fails.
    clean = Path(shutil.copytree(run.repo, tmp_path / "clean"))
    if diff.strip():
        applied = subprocess.run(["git", "apply", "-"], input=diff, text=True, cwd=clean, capture_output=True)
        assert (applied.returncode == 0) == result.applied_cleanly, applied.stderr
    tests = subprocess.run([sys.executable, "-m", "unittest"], cwd=clean, capture_output=True, text=True)
    assert tests.returncode != 0


def test_the_sandbox_reaches_the_adapter_and_nothing_else(run: Any) -> None:
    assert run.probe["adapter"] == '{"ok": true}'
    assert "reached" not in run.probe["engine"] and "refused" in run.probe["engine"]
    assert "reached" not in run.probe["outside"] and "unreachable" in run.probe["outside"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-s"]))
