"""slime's `slime.agent` adapters (OpenAI and Anthropic wire formats) driven as slime's coding-agent example drives
them (tests/integration/slime_plugins/agent_adapters.py), on a real SGLang server: a session that forks (two
continuations of one answer) gives one sample per branch, token-exact, the shared answer trained once."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from rollout.sglang_server import SGLangServer
from slime_like.core.sample import Sample, Status
from tests.integration.recorded_rollout import agent_args, recorded_rollout

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def run(tiny_qwen3: Path, sglang_server: SGLangServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One rollout of 2 samples (one per wire format); every /generate sent, with its answer."""
    root = tmp_path_factory.mktemp("slime-agent")
    (root / "train.jsonl").write_text(json.dumps({"prompt": "What is 6 times 7?"}) + "\n")
    args = agent_args(tiny_qwen3, root, "slime_plugins.agent_adapters.generate", samples=2, max_response_len=200)
    sys.path.insert(0, str(HERE))
    groups, metrics, sent = recorded_rollout(args, sglang_server.url)
    yield groups[0], metrics, sent, sys.modules["slime_plugins.agent_adapters"]
    sys.path.remove(str(HERE))
    for name in [m for m in sys.modules if m.startswith("slime_plugins")]:
        del sys.modules[name]


def sampled_reason(sample: Sample, sent: list[dict[str, Any]]) -> str:
    """Why the sample's last turn stopped, as SGLang said."""
    (last,) = [t for t in sent if t["input_ids"] + sampled(t)[0] == sample.tokens]
    return last["out"]["meta_info"]["finish_reason"]["type"]


def sampled(turn: dict[str, Any]) -> tuple[list[int], list[float]]:
    pairs = turn["out"]["meta_info"]["output_token_logprobs"]
    return [int(t[1]) for t in pairs], [float(t[0]) for t in pairs]


def test_a_fork_gives_one_sample_per_branch_trained_once(run: Any) -> None:
    group, metrics, sent, _ = run
    assert len(group) == 4 and metrics["rollout/openai_branches"] == 2  # 2 samples x 2 branches, each forked once
    assert metrics["rollout/openai_turns"] == 6 and len(sent) == 6
    by_session: dict[str, list[Sample]] = {}
    for sample in group:
        by_session.setdefault(sample.session_id, []).append(sample)
    assert sorted(s.metadata["kind"] for s in group) == ["anthropic", "anthropic", "openai", "openai"]
    for pair in by_session.values():
        main, fork = sorted(pair, key=lambda s: -s.loss_mask[0])  # the first answer trains in the first branch only
        assert main.status == fork.status == Status.COMPLETED and main.reward == fork.reward == 1.0
        assert main.metadata["truncated"] == (main.metadata["openai_turns"] and sampled_reason(main, sent) == "length")
        first, second = sorted(
            (t for t in sent if main.tokens[: len(t["input_ids"])] == t["input_ids"]), key=lambda t: len(t["input_ids"])
        )
        (third,) = [t for t in sent if fork.tokens[: len(t["input_ids"])] == t["input_ids"] and t is not first]
        ids1, lps1 = sampled(first)
        p = len(first["input_ids"])
        assert main.prompt_length == fork.prompt_length == p and main.tokens[:p] == fork.tokens[:p]
        # Both branches hold the first answer's sampled ids, then their own continuation's.
        for sample, last in ((main, second), (fork, third)):
            ids, lps = sampled(last)
            assert sample.tokens[p : p + len(ids1)] == ids1
            assert sample.tokens == last["input_ids"] + ids  # token in, token out: no re-tokenising
            assert sample.loss_mask[-len(ids) :] == [1] * len(ids) and sample.rollout_log_probs[-len(ids) :] == lps
            inserted = len(last["input_ids"]) - p - len(ids1)
            assert inserted > 0 and sample.loss_mask[len(ids1) : len(ids1) + inserted] == [0] * inserted
        # The shared first answer trains in the first branch only; the fork keeps it as context.
        assert main.loss_mask[: len(ids1)] == [1] * len(ids1) and main.rollout_log_probs[: len(ids1)] == lps1
        assert fork.loss_mask[: len(ids1)] == [0] * len(ids1)
        assert second["input_ids"] != third["input_ids"]  # "go on" and "try again"


def test_unknown_and_finished_sessions_are_refused(run: Any) -> None:
    *_, plugin = run
    url, sid, kind = plugin.LATE[0]
    path = "/v1/chat/completions" if kind == "openai" else "/v1/messages"
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    late = requests.post(f"{url}{path}", json=body, headers={"Authorization": f"Bearer {sid}"}, timeout=10)
    assert late.status_code == 503 and "closed" in late.json()["error"]["message"]
    unknown = requests.post(f"{url}{path}", json=body, headers={"Authorization": "Bearer guess"}, timeout=10)
    assert unknown.status_code == 401 and "opened sid" in unknown.json()["error"]["message"]
