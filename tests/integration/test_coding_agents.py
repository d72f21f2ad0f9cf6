"""Claude Code and Codex, unchanged, in local sandboxes against the rollout's endpoint (plugins/coding_agent.py): one
rollout on a tiny model with a long context, then a Megatron train step on its samples. The random model does not
fix the bug: the test is the plumbing (every call reached the engines, token-exact trajectories, branches counted,
reward = the sandbox's test result, the sandbox reaches nothing but the endpoint)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import rollout.generate
from plugins import local_sandbox
from plugins.agent_sandbox import cli_prefix
from plugins.agent_sandbox import local_sandbox as make_sandbox
from rollout.sglang_server import SGLangServer
from slime_like.core.sample import Status
from tests.conftest import _make_tiny
from tests.integration.recorded_rollout import agent_args, recorded_rollout
from tests.integration.test_openai_agents_sdk import TOOLS_TEMPLATE

CLIS = [cli_prefix() / "node_modules/.bin" / name for name in ("claude", "codex")]
MISSING = local_sandbox.check() or next(
    (f"{c.name} is not installed (bash scripts/setup-coding-agents.sh)" for c in CLIS if not c.exists()), None
)  # noqa: E501
pytestmark = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))

# Short system prompts and fewer tools: the CLIs' own (~30k tokens each) take ~1 min per prefill on 2 CPU cores.
CLAUDE_ARGS = (
    "--system-prompt 'You fix bugs. Use the tools.' --tools Bash,Read,Edit --disable-slash-commands --strict-mcp-config"  # noqa: E501
)
CODEX_ARGS = "-c model_instructions_file=/testbed/.instructions.md -c web_search=disabled -c features.multi_agent=false -c features.goals=false"  # noqa: E501
TASK = "The test in test_calc.py fails. Fix calc.py so that `python3 -m unittest` passes."


def _repo(root: Path) -> Path:
    repo = root / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "test_calc.py").write_text(
        "import unittest\nfrom calc import add\n\nclass T(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
    )
    (repo / ".instructions.md").write_text("You fix bugs. Run shell commands with exec_command.\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "task"], check=True)
    return repo


@pytest.fixture(scope="module")
def long_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3 with a 32k context and a chat template that renders tools (Qwen's shape)."""
    model = _make_tiny(tmp_path_factory, "qwen3", max_position_embeddings=32768)
    (model / "chat_template.jinja").write_text(TOOLS_TEMPLATE)
    return model


@pytest.fixture(scope="module")
def server(long_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangServer]:
    server = SGLangServer(
        long_model,
        dtype="float32",
        log_dir=tmp_path_factory.mktemp("logs"),
        startup_timeout=240,
        max_total_tokens=65536,
    )  # noqa: E501
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def run(long_model: Path, server: SGLangServer, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One rollout: a Claude Code sample and a Codex sample; every /generate sent (with when it was sent)."""
    root = tmp_path_factory.mktemp("coding-agents")
    repo = _repo(root)
    rows = [
        {
            "prompt": TASK,
            "metadata": {"repo": str(repo), "test_cmd": "python3 -m unittest", "agent": agent, "cli_args": args},
        }  # noqa: E501
        for agent, args in (("claude_code", CLAUDE_ARGS), ("codex", CODEX_ARGS))
    ]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = agent_args(
        long_model, root, "plugins.coding_agent.generate", "--custom-rm-path", "plugins.coding_agent.test_reward",
        "--rollout-max-context-len", "30000", "--sglang-tool-call-parser", "qwen25", samples=1, prompts=2, max_response_len=256,
    )  # fmt: skip
    args.coding_agent_time_budget = 240
    sent_at: list[tuple[float, list[int]]] = []
    original = rollout.generate.post_generate

    async def timed(ctx: Any, payload: dict[str, Any], retries: int | None = None, **kw: Any) -> dict[str, Any]:
        sent_at.append((time.monotonic(), list(payload["input_ids"])))
        return await original(ctx, payload, retries, **kw)

    rollout.generate.post_generate = timed  # type: ignore[assignment]
    try:
        groups, metrics, sent = recorded_rollout(args, server.url)
    finally:
        rollout.generate.post_generate = original  # type: ignore[assignment]
    return groups, metrics, sent, sent_at, repo


def _sampled(turn: dict[str, Any]) -> tuple[list[int], list[float]]:
    pairs = turn["out"]["meta_info"]["output_token_logprobs"]
    return [int(t[1]) for t in pairs], [float(t[0]) for t in pairs]


def test_both_clis_reach_the_engines_token_exact_with_the_sandboxs_reward(run: Any) -> None:
    groups, metrics, sent, sent_at, _ = run
    samples = [s for g in groups for s in g]
    by_agent = {s.metadata["coding_agent"]["agent"] for s in samples if "coding_agent" in s.metadata}
    assert by_agent == {"claude_code", "codex"}, [s.metadata.get("agent_error") for s in samples]
    assert metrics["rollout/openai_turns"] == len(sent) > 0  # every call the CLIs made was generated by the engine
    assert len(samples) == 2 + metrics.get("rollout/openai_branches", 0)  # one more sample per branch
    for sample in samples:
        result = sample.metadata["coding_agent"]
        assert sample.status in (Status.COMPLETED, Status.TRUNCATED), sample.metadata.get("agent_error")
        # The reward is the sandbox's test run: the random model fixed nothing, so it failed.
        assert result["tests_passed"] is False and "FAILED (failures=1)" in result["test_output"]
        assert sample.reward == 0.0
        # Token in, token out: the sample is the last call's ids plus what SGLang sampled, each model span masked 1.
        (last,) = [t for t in sent if t["input_ids"] + _sampled(t)[0] == sample.tokens]
        ids, lps = _sampled(last)
        assert sample.loss_mask[-len(ids) :] == [1] * len(ids) and sample.rollout_log_probs[-len(ids) :] == lps
        trained = [t for t, m in zip(sample.tokens[sample.prompt_length :], sample.loss_mask, strict=True) if m]
        own = [t for t in sent if sample.tokens[: len(t["input_ids"])] == t["input_ids"]]
        assert (
            trained
            == [i for t in sorted(own, key=lambda t: len(t["input_ids"])) for i in _sampled(t)[0]][-len(trained) :]
        )  # noqa: E501
        # Start-up: from the CLI's launch to its first model call.
        first = min(t for t, ids in sent_at if sample.tokens[: len(ids)] == ids)
        startup = first - result["launched_at"]
        print(
            f"[figure] {result['agent']}: start-up {startup:.2f} s (sandbox {result['sandbox_s']:.2f} s), {len(own)} calls"
        )  # noqa: E501
        assert 0 < startup < 60


def test_the_sandbox_reaches_the_endpoint_and_nothing_else(run: Any, server: SGLangServer) -> None:
    """A sandbox made as the plugin makes them, bridged to a port: that port answers, the SGLang server does not."""
    *_, repo = run
    engine_port = int(server.url.rsplit(":", 1)[1])
    probe = 'python3 -c \'import socket; socket.create_connection(("127.0.0.1", {}), timeout=3); print("reached")\' 2>&1 | tail -1'  # noqa: E501

    async def main() -> tuple[str, str]:
        async with make_sandbox(repo, bridge=[engine_port]) as bridged, make_sandbox(repo, bridge=[]) as closed:
            return (await bridged.exec(probe.format(engine_port)))[1], (await closed.exec(probe.format(engine_port)))[1]  # noqa: E501

    bridged, closed = asyncio.run(main())
    assert bridged.strip() == "reached" and "refused" in closed


@pytest.mark.slow  # Megatron on ~6k-token sequences with unfused CPU attention: ~1 min, ~15 GB at its peak
def test_a_train_step_on_the_agents_samples(run: Any, long_model: Path) -> None:
    import torch

    from buffer.train_data import build_train_data
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.optimizer import OptimizerSettings
    from slime_like.trainer.megatron.parallel import init_parallel

    groups, *_ = run
    data = build_train_data(groups)
    init_parallel(tp=1, pp=1, seed=1234)
    engine = MegatronTrainEngine(long_model, OptimizerSettings(lr=1e-3), max_tokens_per_micro_batch=8192)

    def loss(per_sequence: Any, rows: Any) -> Any:
        terms = [-(lp[-n:] * torch.tensor(mask)).sum() for lp, (n, mask) in zip(per_sequence, rows, strict=True)]
        return sum(terms) / sum(map(sum, data.loss_masks))

    before = engine.forward_logprobs(data.tokens)
    for lp, n, sampled in zip(before, data.response_lengths, data.rollout_log_probs, strict=True):
        assert torch.allclose(lp[-n:], torch.tensor(sampled), atol=1e-3)  # the engine's ids, scored by Megatron
    out = engine.train_step(data.tokens, list(zip(data.response_lengths, data.loss_masks, strict=True)), loss)
    assert torch.isfinite(torch.tensor(out["loss"]))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-s"]))
