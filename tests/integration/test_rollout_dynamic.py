"""Over-sampling, dynamic sampling, abort and partial rollout against two real SGLang workers behind the router.

The tiny random model writes junk, so a plugin written here forces the structure: the reward depends on the
group index (groups 0 and 1 of every 6 have zero variance and must be dropped), and group 3 of every 6 asks
for 1500 tokens on its first attempt, so it is still generating when the batch is full and must be aborted.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from buffer.train_data import build_train_data
from rollout.manager import RolloutManager
from rollout.router import SGLangRouter
from rollout.sglang_server import SGLangServer
from slime_like.arguments import parse_args
from slime_like.core.sample import Status

BATCH, OVER, N = 2, 3, 2
PLUGIN = """
from rollout.filters import check_reward_nonzero_std
from rollout.generate import generate as default_generate

SEEN = []  # (group_index, kept) for every group the dynamic filter judged
SLOW = 3


def reward(args, sample):
    return 1.0 if sample.group_index % 6 in (0, 1) else float(sample.index % 2)


def dynamic_filter(args, group):
    verdict = check_reward_nonzero_std(args, group)
    SEEN.append((group[0].group_index, verdict.keep))
    return verdict


async def generate(ctx, sample, params):
    params = dict(params, ignore_eos=True)
    if sample.response_length:
        params["max_new_tokens"] = sample.response_length + 4  # a continued sample finishes 4 tokens later
    elif sample.group_index % 6 == SLOW:
        params["max_new_tokens"] = 1500  # still running when the batch is full
    else:
        params["max_new_tokens"] = 6
    return await default_generate(ctx, sample, params)
"""


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("dynamic")
    rows = [{"prompt": f"What is {a} + {a}?", "label": str(2 * a)} for a in range(40)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "dyn_plugin.py").write_text(PLUGIN)
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))
    sys.modules.pop("dyn_plugin", None)


def manager(model: Path, task: Path, workers: list[SGLangServer], router: SGLangRouter, *extra: str) -> RolloutManager:
    args = parse_args(
        [
            "--hf-checkpoint", str(model), "--prompt-data", str(task / "train.jsonl"), "--input-key", "prompt", "--label-key", "label",
            "--rollout-batch-size", str(BATCH), "--over-sampling-batch-size", str(OVER),
            "--n-samples-per-prompt", str(N), "--num-rollout", "3", "--rollout-max-response-len", "2000",
            "--custom-rm-path", "dyn_plugin.reward", "--custom-generate-function-path", "dyn_plugin.generate",
            "--dynamic-sampling-filter-path", "dyn_plugin.dynamic_filter", "--output-dir", str(task / "out"),
            *extra,
        ]
    )  # fmt: skip
    importlib.import_module("dyn_plugin").SEEN.clear()
    return RolloutManager(args, server_urls=[s.url for s in workers], router_url=router.url)


def log_count(server: SGLangServer, line: str) -> int:
    return server.log_path.read_text(errors="replace").count(line)


def wait_idle(workers: list[SGLangServer], timeout: float = 3.0) -> list[int]:
    """Requests each server still holds (running or waiting), once all are 0 or the timeout passed."""
    deadline = time.monotonic() + timeout
    while True:
        loads = [sum(r["num_reqs"] for r in requests.get(f"{s.url}/get_load", timeout=10).json()) for s in workers]
        if not any(loads) or time.monotonic() > deadline:
            return loads
        time.sleep(0.2)


ABORTS = '"POST /abort_request HTTP/1.1" 200'
GENERATES = '"POST /generate HTTP/1.1" 200'


def test_dynamic_sampling_keeps_exactly_the_batch_and_aborts_the_rest(
    tiny_qwen3: Path, task: Path, workers: list[SGLangServer], router: SGLangRouter
) -> None:
    m = manager(tiny_qwen3, task, workers, router)
    seen = sys.modules["dyn_plugin"].SEEN
    aborts = [log_count(s, ABORTS) for s in workers]
    served = [log_count(s, GENERATES) for s in workers]
    start = time.monotonic()
    groups, metrics = m.generate(0)
    assert time.monotonic() - start < 30  # the 1500-token group did not run to its end
    assert len(groups) == BATCH and metrics["rollout/groups_kept"] == BATCH
    assert all(len({s.reward for s in g}) > 1 for g in groups)  # only groups with reward variance train
    dropped = [gi for gi, kept in seen if not kept]
    assert sorted(dropped) == [0, 1]
    assert metrics["rollout/groups_dropped"] == metrics["rollout/groups_dropped_zero_std"] == 2
    returned = m.buffer.returned_groups()
    assert metrics["rollout/groups_started"] == BATCH + len(dropped) + len(returned) == 2 * OVER
    assert metrics["rollout/groups_aborted"] >= 1 and 3 in [g[0].group_index for g in returned]
    # The accounting adds up: drawn = trained + failed + dropped + returned (checked in the loop, reported here).
    assert metrics["rollout/groups_drawn"] == metrics["rollout/groups_drawn_source"] == 2 * OVER
    assert metrics["rollout/groups_trained"] == BATCH and metrics["rollout/groups_failed"] == 0
    assert metrics["rollout/groups_returned"] == len(returned)
    # Without --partial-rollout a returned group starts over: no tokens, pending, same sample indices.
    for g in returned:
        assert all(s.status == Status.PENDING and s.response_length == 0 and not s.tokens for s in g)
        assert [s.index for s in g] == [g[0].group_index * N + i for i in range(N)]
    # Nothing of this rollout keeps running, on either server; both were told to abort, directly.
    assert wait_idle(workers) == [0, 0]
    time.sleep(0.5)  # access-log lines land just after the answers
    assert all(log_count(s, ABORTS) > a for s, a in zip(workers, aborts, strict=True))
    # The router spread the requests over both workers.
    assert all(log_count(s, GENERATES) > n for s, n in zip(workers, served, strict=True))
    data = build_train_data(groups)
    assert len(data) == BATCH * N and sorted(data.sample_indices) == sorted(s.index for g in groups for s in g)
    m.shutdown()


def test_partial_rollout_continues_aborted_groups_without_loss_or_duplicates(
    tiny_qwen3: Path, task: Path, workers: list[SGLangServer], router: SGLangRouter
) -> None:
    m = manager(tiny_qwen3, task, workers, router, "--partial-rollout", "--mask-offpolicy-in-partial-rollout")
    seen = sys.modules["dyn_plugin"].SEEN
    kept = []
    from_source = 0
    for rollout_id in range(3):
        groups, metrics = m.generate(rollout_id)
        assert len(groups) == BATCH and metrics["rollout/groups_kept"] == BATCH
        assert wait_idle(workers) == [0, 0]
        kept += groups
        settled = ("trained", "failed", "dropped", "returned")
        assert metrics["rollout/groups_drawn"] == sum(metrics[f"rollout/groups_{k}"] for k in settled)
        from_source += metrics["rollout/groups_drawn_source"]
    assert from_source == m.buffer.source.next_group_index  # every fresh group was counted once
    # Every group the data source handed out is accounted for exactly once: trained, dropped, or waiting.
    kept_ids = [g[0].group_index for g in kept]
    dropped_ids = [gi for gi, ok in seen if not ok]
    waiting_ids = [g[0].group_index for g in m.buffer.returned_groups()]
    assert len(set(kept_ids)) == len(kept_ids)
    assert sorted(kept_ids + dropped_ids + waiting_ids) == list(range(m.buffer.source.next_group_index))
    indices = [s.index for g in kept for s in g]
    assert len(set(indices)) == len(indices) == len(kept) * N
    # The slow group was aborted mid-generation in rollout 0 and finished later from where it stopped:
    # its earlier tokens are masked from the loss, the 4 continued ones are not.
    slow = next(g for g in kept if g[0].group_index == 3)
    for s in slow:
        partial = s.loss_mask.index(1)
        assert partial > 0 and s.metadata["partial_rollouts"] >= 1
        assert s.loss_mask == [0] * partial + [1] * 4 and s.response_length == partial + 4
        assert len(s.rollout_log_probs) == s.response_length == len(s.tokens) - s.prompt_length
        assert s.status == Status.TRUNCATED
    m.shutdown()
