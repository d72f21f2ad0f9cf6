"""Plugins written for slime (tests/integration/slime_plugins) run unchanged on a real SGLang server behind a
real router: a multi-turn search agent against a local search server, a tool agent scoring some of its own
samples with dict rewards, a multi-agent rollout function with groups of different sizes, and slime's filters
and reward post-process. The loss and advantage hooks run in tests/megatron/test_slime_hooks.py.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from buffer.train_data import build_train_data
from rollout.manager import RolloutManager
from rollout.router import SGLangRouter
from rollout.sglang_server import SGLangServer
from slime_like.arguments import parse_args
from slime_like.core.sample import Status

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def plugins() -> Iterator[None]:
    """slime_plugins importable, as slime's examples are through PYTHONPATH."""
    sys.path.insert(0, str(HERE))
    yield
    sys.path.remove(str(HERE))
    for name in [m for m in sys.modules if m == "slime_plugins" or m.startswith("slime_plugins.")]:
        del sys.modules[name]


@pytest.fixture(scope="module")
def search_server() -> Iterator[tuple[str, list[str]]]:
    """A retrieval server in the style of Search-R1's (POST /retrieve) on 127.0.0.1; records the queries."""
    queries: list[str] = []

    async def retrieve(request: web.Request) -> web.Response:
        body = await request.json()
        queries.extend(body["queries"])
        docs = [[{"document": {"contents": f"{q}\nThe answer is 7."}}] * body["topk"] for q in body["queries"]]
        return web.json_response({"result": docs})

    async def start() -> web.AppRunner:
        app = web.Application()
        app.router.add_post("/retrieve", retrieve)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="search-server", daemon=True).start()
    runner = asyncio.run_coroutine_threadsafe(start(), loop).result()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/retrieve", queries
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result()
        loop.call_soon_threadsafe(loop.stop)


@pytest.fixture(scope="module")
def one_router(sglang_server: SGLangServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangRouter]:
    """A router in front of the session's server: slime plugins post to args.sglang_router_ip/port."""
    with SGLangRouter([sglang_server.url], policy="round_robin", log_dir=tmp_path_factory.mktemp("router")) as r:
        yield r


@pytest.fixture(scope="module")
def make(
    tiny_qwen3: Path, sglang_server: SGLangServer, one_router: SGLangRouter, plugins: None, tmp_path_factory: Any
) -> Iterator[Any]:
    """Build a RolloutManager on the running server and router from extra flags; all shut down at the end."""
    root = tmp_path_factory.mktemp("slime-task")
    rows = [{"prompt": f"Question {i}: what is 3 + 4? Search, then answer.", "label": "7"} for i in range(8)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    made: list[RolloutManager] = []

    def build(*extra: str) -> RolloutManager:
        args = parse_args(
            ["--hf-checkpoint", str(tiny_qwen3), "--prompt-data", str(root / "train.jsonl"),
             "--input-key", "prompt", "--label-key", "label",
             "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "1",
             "--rollout-max-response-len", "48", "--output-dir", str(root / "out"), *extra]
        )  # fmt: skip
        made.append(RolloutManager(args, server_urls=[sglang_server.url], router_url=one_router.url))
        return made[-1]

    yield build
    for m in made:
        m.shutdown()


def test_search_agent_with_slime_filters_and_reward_post_process(make: Any, search_server: Any) -> None:
    url, queries = search_server
    m = make(
        "--custom-generate-function-path", "slime_plugins.search_agent.generate",
        "--custom-rm-path", "slime_plugins.search_agent.reward_func",
        "--buffer-filter-path", "slime_plugins.filters.newest_first",
        "--dynamic-sampling-filter-path", "slime_plugins.filters.drop_odd_groups",
        "--rollout-sample-filter-path", "slime_plugins.filters.remove_odd_samples",
        "--custom-reward-post-process-path", "slime_plugins.filters.centre_rewards",
        "--rollout-all-samples-process-path", "slime_plugins.filters.record_all_samples",
        "--over-sampling-batch-size", "1",
    )  # fmt: skip
    assert set(m.hooks.contracts.values()) == {"slime"} and len(m.hooks.contracts) == 6
    importlib.import_module("slime_plugins.search_agent").SEARCH_URL = url  # loaded (as slime_plugins) by the loader
    m.buffer.add_groups(m.buffer.get_groups(3))  # groups 0, 1, 2 handed back, e.g. by an aborted rollout
    groups, metrics = m.generate(0)
    # The 4-argument buffer filter served the newest first (rollout_id None, as slime passes); the odd group was
    # dropped by the DynamicFilterOutput filter and counted under its reason.
    assert importlib.import_module("slime_plugins.filters").CALLS["buffer"] == [
        (None, [0, 1, 2], 1), (None, [0, 1], 1), (None, [0], 1)
    ]  # fmt: skip
    assert [g[0].group_index for g in groups] == [0, 2] and metrics["rollout/groups_dropped_odd_group"] == 1
    # slime's all-samples process saw every generated group, the dropped one too, after the sample filter ran on
    # the kept ones (odd samples removed; the dropped group's untouched); its data source is the run's (8 prompts).
    assert importlib.import_module("slime_plugins.filters").CALLS["all_samples"] == [
        ([0, 1, 2], [False, True, False, False, False, True], 8)
    ]  # fmt: skip
    assert len(queries) == 6  # every sample searched once, kept or not
    for sample in (s for g in groups for s in g):
        assert sample.status == Status.COMPLETED and len(sample.metadata["queries"]) == 1
        assert "<information>" in sample.response and "The answer is 7." in sample.response
        assert len(sample.loss_mask) == len(sample.rollout_log_probs) == sample.response_length
        if sample.index % 2:  # remove_sample from the slime sample filter: no loss at all
            assert sample.remove_sample and sample.loss_mask == [0] * sample.response_length
        else:  # the retrieved passage (between the two turns) has loss mask 0 and log-prob 0.0
            masked = [i for i, m in enumerate(sample.loss_mask) if m == 0]
            assert len(masked) > 5 and masked == list(range(masked[0], masked[-1] + 1))
            assert all(sample.rollout_log_probs[i] == 0.0 for i in masked) and sample.loss_mask[-1] == 1
        assert sample.metadata["raw_reward"] in (0.0, 0.2, 1.0) and sample.metadata["reward_normalized"]
    assert metrics["rollout/samples_excluded_from_loss"] == 2
    for group in groups:  # the post-process's rewards (raw minus the group mean) are what trains
        raw = [s.metadata["raw_reward"] for s in group]
        assert [s.reward for s in group] == pytest.approx([r - sum(raw) / len(raw) for r in raw])
    data = build_train_data(groups)
    assert data.reward_normalized == [True] * 4 and data.raw_rewards == [s.reward for g in groups for s in g]


def test_tool_agent_keeps_its_own_rewards_and_dict_rewards(make: Any) -> None:
    m = make(
        "--custom-generate-function-path", "slime_plugins.tool_agent.generate",
        "--custom-rm-path", "slime_plugins.tool_agent.reward_func", "--reward-key", "score",
    )  # fmt: skip
    groups, metrics = m.generate(0)
    samples = [s for g in groups for s in g]
    scored = importlib.import_module("slime_plugins.tool_agent").SCORED
    assert sorted(scored) == [s.index for s in samples if s.index % 2 == 0]  # the others were scored by generate
    for sample in samples:
        assert sample.status == Status.COMPLETED and sample.weight_versions  # from slime's generate
        if sample.index % 2:
            assert sample.reward == {
                "score": 0.0,
                "pred": None,
                "error": "tool failed: integer division or modulo by zero",
            }
        else:
            assert "<result>42</result>" in sample.response and sample.reward["trace"] == ["calc", "answer"]
            assert sample.reward["score"] == float(sample.reward["pred"] == "7")
            masked = [i for i, m in enumerate(sample.loss_mask) if m == 0]
            assert masked and all(sample.rollout_log_probs[i] == 0.0 for i in masked)
    rewards = build_train_data(groups, reward_key="score").raw_rewards
    assert rewards == [s.reward["score"] for s in samples] and "rollout/reward_failed" not in metrics
    assert metrics["rollout/reward_mean"] == sum(rewards) / len(rewards)


def test_multi_agent_rollout_function_with_groups_of_different_sizes(make: Any) -> None:
    m = make(
        "--rollout-function-path", "slime_plugins.multi_agent.generate_rollout",
        "--custom-generate-function-path", "slime_plugins.multi_agent.generate_with_agents",
    )  # fmt: skip
    groups, metrics = m.generate(0)
    # Sample i fans out into 1 + i % 3 agents: group 0 (samples 0, 1) has 3, group 1 (samples 2, 3) has 4.
    assert [len(g) for g in groups] == [3, 4] and metrics["rollout/agents"] == 7
    for group in groups:
        for rollout_id in {s.rollout_id for s in group}:
            siblings = [s for s in group if s.rollout_id == rollout_id]
            assert {s.index for s in siblings} == {rollout_id}
            assert [s.metadata["role"] for s in siblings] == ["solver"] + ["reviewer"] * (len(siblings) - 1)
            # The reward the generate function split among the siblings was kept, not re-scored.
            assert all(s.reward in (1.0 / len(siblings), 2.0 / len(siblings)) for s in siblings)
        assert all(s.status == Status.COMPLETED and s.response.startswith("<answer>") for s in group)
    assert len(m.buffer) == 1 and m.buffer.returned_groups()[0][0].group_index == 2  # handed back by add_samples
    assert build_train_data(groups).group_ids == [0, 0, 0, 1, 1, 1, 1]
