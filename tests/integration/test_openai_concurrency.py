"""Hundreds of concurrent agent sessions on the OpenAI-compatible endpoint, with faults mixed in: 256 samples in one
rollout on a real SGLang server, of which some agents hang past their timeout, some raise, and some first call
without the run's secret. Every sample comes back, each fault fails only its own sample with a clear error, and the
metrics count them."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout.manager import RolloutManager
from rollout.sglang_server import SGLangServer
from slime_like.core.sample import Status
from tests.integration.recorded_rollout import agent_args

PROMPTS, PER_PROMPT = 32, 8  # 256 sessions
PLUGIN = r"""
import asyncio
import aiohttp
from plugins.openai_agent import openai_client, run_openai_agent


async def agent(base_url, api_key, sample):
    if sample.index % 64 == 5:  # first a call without the run's secret
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{base_url}/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}) as r:
                sample.metadata["keyless"] = (r.status, (await r.json())["error"]["message"])
    client = openai_client(base_url, api_key, max_retries=0)
    reply = await client.chat.completions.create(model="policy", messages=sample.prompt, max_tokens=2)
    if sample.index % 64 == 1:
        raise ValueError(f"agent bug in sample {sample.index}")
    if sample.index % 64 == 2:
        await asyncio.sleep(3600)
    sample.metadata["answer"] = reply.choices[0].message.content


async def generate(ctx, sample, params):
    return await run_openai_agent(ctx, sample, params, agent, timeout=20.0)
"""


@pytest.fixture(scope="module")
def run(tiny_qwen3: Path, sglang_server: SGLangServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    root = tmp_path_factory.mktemp("openai-many")
    rows = [{"prompt": [{"role": "user", "content": f"What is {i} plus {i}?"}]} for i in range(PROMPTS)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "many_agents_under_test.py").write_text(PLUGIN)
    sys.path.insert(0, str(root))
    args = agent_args(
        tiny_qwen3, root, "many_agents_under_test.generate", "--rm-type", "f1",
        prompts=PROMPTS, samples=PER_PROMPT, max_response_len=16,
    )  # fmt: skip
    manager = RolloutManager(args, server_urls=[sglang_server.url], router_url=sglang_server.url)
    try:
        start = time.monotonic()
        groups, metrics = manager.generate(0)
        seconds = time.monotonic() - start
    finally:
        manager.shutdown()
        sys.path.remove(str(root))
        sys.modules.pop("many_agents_under_test", None)
    yield groups, metrics, seconds


def test_256_sessions_with_hangs_raises_and_keyless_calls(run: Any) -> None:
    groups, metrics, seconds = run
    samples = [s for g in groups for s in g]
    assert len(groups) == PROMPTS and all(len(g) == PER_PROMPT for g in groups)
    assert sorted(s.index for s in samples) == list(range(PROMPTS * PER_PROMPT))  # nothing lost
    raised = [s for s in samples if s.index % 64 == 1]
    hung = [s for s in samples if s.index % 64 == 2]
    keyless = [s for s in samples if s.index % 64 == 5]
    for s in raised:
        assert s.status == Status.FAILED and s.metadata["agent_error"] == f"agent raised ValueError: agent bug in sample {s.index}"  # fmt: skip
    for s in hung:
        assert s.status == Status.FAILED and s.metadata["agent_error"] == "agent timed out after 20s"
    for s in keyless:
        status, message = s.metadata["keyless"]
        assert status == 401 and "run's secret" in message and s.status == Status.COMPLETED
    ok = [s for s in samples if s.index % 64 not in (1, 2)]
    assert all(s.status in (Status.COMPLETED, Status.TRUNCATED) and s.metadata["openai_turns"] == 1 for s in ok)
    assert all(0 < sum(s.loss_mask) == s.response_length <= 2 for s in ok)
    # Each fault is counted once; every session made its one model call.
    assert metrics["rollout/openai_agent_failed"] == len(raised) == 4
    assert metrics["rollout/openai_agent_timeout"] == len(hung) == 4
    assert metrics["rollout/generate_failed"] == 8
    assert metrics["rollout/openai_unauthorized"] == len(keyless) == 4
    assert metrics["rollout/openai_turns"] == PROMPTS * PER_PROMPT
    print(f"256 sessions (4 hanging 20 s) in {seconds:.1f}s")
