"""--fully-async against real SGLang: weight updates under in-flight requests in each pause mode (the rollout side,
on the session's server), and the real loop (Ray, SGLang, Megatron): with generate, reward and dynamic-filter plugins
on two engines under --use-fault-tolerance, one engine killed mid-generation; then plain (one engine, no plugin),
resumed from that run's checkpoint taken while groups were in flight. (Two runs, not three: a start-up is most of a
run's cost.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import requests

from rollout import sglang_client as client
from rollout.manager import RolloutManager
from rollout.sglang_server import SGLangServer
from slime_like.arguments import parse_args
from slime_like.core.secret import auth_headers
from tests.conftest import REPO_ROOT
from tests.integration.test_fault_tolerance import start_reading, wait_for

BATCH, N = 2, 2
# Groups 0 and 1 finish at once (the first batch); later ones write LONG tokens, so they are still generating when
# the test pauses the server for a weight update.
LONG = 300
PLUGIN = f"""
from rollout.generate import generate as default_generate


async def generate(ctx, sample, params):
    params = dict(params, ignore_eos=True)
    if sample.group_index < {BATCH}:
        params["max_new_tokens"] = 4
    else:
        params["max_new_tokens"] = {LONG}  # the default generate continues a partial sample up to this
    return await default_generate(ctx, sample, params)
"""

# A generate function that marks what it generated, and a reward that makes every odd group's rewards equal (the
# dynamic filter drops those) and every even group's differ.
TAGGING_PLUGIN = """
from rollout.generate import generate as default_generate


async def generate(ctx, sample, params):
    sample = await default_generate(ctx, sample, params)
    sample.metadata["generated_by"] = "tagging_plugin"
    return sample


def reward(args, sample):
    return float(sample.group_index % 2 == 0 and sample.index % 2 == 0)
"""


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("fully-async")
    rows = [{"prompt": f"{a}+{a}=", "label": str(2 * a)} for a in range(8)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "long_plugin.py").write_text(PLUGIN)
    (root / "tagging_plugin.py").write_text(TAGGING_PLUGIN)
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))
    sys.modules.pop("long_plugin", None)
    sys.modules.pop("tagging_plugin", None)


def in_flight(server: SGLangServer) -> int:
    """Requests the server holds (running or waiting)."""
    # The run secret too: a server started after an earlier test made one demands it (slime_like.core.secret).
    load = requests.get(f"{server.url}/get_load", headers=auth_headers(), timeout=10)
    return sum(r["num_reqs"] for r in load.json())


def check_spans(groups: list[list], version: int, bound: int) -> None:
    """Every response token is in a span of the version that generated it; none older than the bound allows."""
    for sample in (s for g in groups for s in g):
        spans = sample.version_spans
        assert sum(n for _, n in spans) == sample.response_length, (sample.index, spans, sample.response_length)
        versions = [v for v, _ in spans]
        assert versions == sorted(versions) and all(version - bound <= v <= version for v in versions), spans


@pytest.mark.parametrize("mode", ["abort", "retract", "in_place"])
def test_weight_update_under_in_flight_requests(
    mode: str, tiny_qwen3: Path, task: Path, pause_server: SGLangServer
) -> None:
    args = parse_args(
        [
            "--hf-checkpoint", str(tiny_qwen3), "--prompt-data", str(task / "train.jsonl"), "--input-key", "prompt",
            "--label-key", "label", "--rollout-batch-size", str(BATCH), "--n-samples-per-prompt", str(N),
            "--num-rollout", "2", "--rollout-max-response-len", str(LONG), "--sglang-server-concurrency", "4",
            "--custom-generate-function-path", "long_plugin.generate", "--output-dir", str(task / mode),
            "--fully-async", "--pause-generation-mode", mode, "--max-weight-staleness", "1",
        ]
    )  # fmt: skip
    url = pause_server.url
    client.set_weight_version(url, 0)
    m = RolloutManager(args, server_urls=[url], router_url=url)
    paused = False
    try:
        first, metrics = m.next_batch(0)
        assert [g[0].group_index for g in first] == [0, 1]
        assert metrics["rollout/staleness_max"] == 0 and metrics["rollout/groups_trained"] == 2
        deadline = time.monotonic() + 30
        while in_flight(pause_server) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert in_flight(pause_server) > 0, "no request in flight to pause"
        m.pause_generation(mode)
        paused = True
        held = in_flight(pause_server)
        # The weight update itself (the same weights, from disk: the versions are what is checked here).
        client.update_weights_from_disk(url, str(tiny_qwen3), 1)
        m.continue_generation(1)
        paused = False
        second, metrics = m.next_batch(1)
    finally:
        if paused:
            client.continue_generation(url)
        m.shutdown()
    if mode == "abort":
        assert held == 0  # returned to the client with their tokens so far
        assert metrics["rollout/samples_partial"] > 0
    else:
        assert held > 0  # kept in the engine across the update
    check_spans(second, 1, 1)
    samples = [s for g in second for s in g]
    assert all(s.response_length == LONG for s in samples)
    # Requests paused mid-way: their first tokens came from version 0, the rest from version 1.
    assert any([v for v, _ in s.version_spans] == [0, 1] for s in samples), [s.version_spans for s in samples]
    assert metrics["rollout/groups_drawn"] == (
        metrics["rollout/groups_trained"] + metrics["rollout/groups_failed"] + metrics["rollout/groups_dropped"]
        + metrics["rollout/groups_returned"] + metrics["rollout/groups_carried"]
    )  # fmt: skip


# -- the real loop -------------------------------------------------------------------------------------------------

NUM_ROLLOUT, BOUND = 4, 1


def loop_command(model: Path, task: Path, out: Path, *extra: str) -> list[str]:
    """`python -m slime_like.train_async --fully-async` with a small config."""
    return [
        sys.executable, "-m", "slime_like.train_async", "--fully-async", "--max-weight-staleness", str(BOUND),
        "--hf-checkpoint", str(model), "--prompt-data", str(task / "train.jsonl"), "--rollout-shuffle",
        "--input-key", "prompt", "--label-key", "label", "--rollout-batch-size", str(BATCH),
        "--n-samples-per-prompt", str(N), "--num-rollout", str(NUM_ROLLOUT), "--rollout-max-response-len", "24",
        "--sglang-server-concurrency", "4", "--lr", "1e-3", "--output-dir", str(out / "run"),
        "--save", str(out / "ckpt"), "--save-interval", "2", "--save-debug-rollout-data", "--ray-num-cpus", "4",
        *extra,
    ]  # fmt: skip


def loop_env(task: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{task}:{REPO_ROOT}", "OMP_NUM_THREADS": "1"}


def records_of(out: Path) -> list[dict]:
    """A run's metrics records."""
    return [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]


def run_loop(model: Path, task: Path, out: Path, *extra: str) -> list[dict]:
    """Run the loop to its end; its metrics records."""
    cmd = loop_command(model, task, out, *extra)
    proc = subprocess.run(cmd, env=loop_env(task), cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return records_of(out)


def trained(out: Path) -> dict[int, list[dict]]:
    """The samples each step trained on, by rollout id."""
    return {
        int(f.stem.split("_")[1]): [json.loads(line) for line in f.read_text().splitlines()]
        for f in sorted((out / "run" / "rollouts").glob("rollout_*.jsonl"))
    }


def check_steps(records: list[dict], per_step: dict[int, list[dict]], first: int) -> None:
    """Full batches, spans, the staleness bound on every trained sample, metrics and balanced accounting."""
    steps = [r for r in records if "train/loss" in r]
    assert [r["step"] for r in steps] == list(range(first, NUM_ROLLOUT)) == sorted(per_step)
    for r in steps:
        samples = per_step[r["step"]]
        assert len(samples) == BATCH * N and r["rollout/num_samples"] == BATCH * N
        for s in samples:
            spans = s["version_spans"]
            assert spans and sum(n for _, n in spans) == s["response_length"], s
            ages = [r["step"] - v for v, _ in spans]
            assert 0 <= min(ages) and max(ages) <= BOUND, (r["step"], spans)  # never over the bound
        ages = [r["step"] - min(v for v, _ in s["version_spans"]) for s in samples]
        assert r["rollout/staleness_max"] == max(ages)
        assert r["rollout/staleness_mean"] == pytest.approx(sum(ages) / len(ages))
        assert sum(r.get(f"rollout/staleness_{k}_samples", 0) for k in range(BOUND + 1)) == len(samples)
        drawn = r["rollout/groups_drawn_source"] + r["rollout/groups_drawn_buffer"] + r["rollout/groups_drawn_carried"]
        settled = sum(r[f"rollout/groups_{k}"] for k in ("trained", "failed", "dropped", "returned", "carried"))
        assert drawn == r["rollout/groups_drawn"] == settled
        assert r["time/trainer_idle"] >= 0 and 0 <= r["time/engine_idle_frac"] <= 1
        # A step may train only groups generated before it (or restored by --load): nothing generated in it.
        assert r["perf/tokens_generated_per_s"] >= 0 and r["perf/tokens_trained_per_s"] > 0
    assert sum(r["perf/tokens_generated_per_s"] for r in steps) > 0
    for before, after in zip(steps, steps[1:], strict=False):  # what one step carries out, the next carries in
        assert before["rollout/groups_carried"] == after["rollout/groups_drawn_carried"]


def test_fully_async_loop(plugin_run: tuple[Path, str, int]) -> None:
    """The loop's steps (the plugin run's, below: its plugins and its killed engine change none of this)."""
    out, _, _ = plugin_run
    records = records_of(out)
    check_steps(records, trained(out), 0)
    # The versions the servers ran: 0, then one more after each step's update.
    assert [r["rollout/weight_version"] for r in records if "train/loss" in r] == list(range(NUM_ROLLOUT))


def test_resume_trains_the_groups_in_flight(
    plugin_run: tuple[Path, str, int], tiny_qwen3: Path, task: Path, tmp_path: Path
) -> None:
    """The plain loop (one engine, no plugin) resumed from the plugin run's first checkpoint."""
    out, _, _ = plugin_run
    checkpoint = out / "ckpt" / "iter_0000001"
    state = json.loads((checkpoint / "slime_like_state.json").read_text())["rollout_state"]
    # Saved with the checkpoint in front of the buffer's groups: those generating, or finished and untrained.
    held_count = state["fully_async"]["groups_ready"] + state["fully_async"]["groups_generating"]
    held = {g[0]["group_index"]: g for g in state["returned"][:held_count]}
    assert held_count > 0 and len(held) == held_count
    returned = {g[0]["group_index"] for g in state["returned"]}
    records = run_loop(tiny_qwen3, task, tmp_path, "--load", str(checkpoint))
    per_step = trained(tmp_path)
    check_steps(records, per_step, 2)
    samples = [s for step in per_step.values() for s in step]
    # Held groups train in the resumed run; every other group is new: nothing trained before the checkpoint
    # trains again.
    assert {s["group_index"] for s in samples} & set(held)
    assert all(s["group_index"] in returned or s["group_index"] >= state["source"]["next_group_index"] for s in samples)
    # A held sample that was not generated again continues from its saved tokens.
    saved = {s["index"]: s for g in held.values() for s in g}
    for sample in samples:
        before = saved.get(sample["index"])
        if before and before["response_length"] and sample["version_spans"][0][0] <= 1:
            assert sample["tokens"][: len(before["tokens"])] == before["tokens"]


@pytest.fixture(scope="module")
def plugin_run(tiny_qwen3: Path, task: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, int]:
    """The loop with generate, reward and dynamic-filter plugins, on two engines under --use-fault-tolerance with the
    weight check: engine 1 is SIGKILLed once the first step is logged (--fully-async generates all the time, so the
    kill lands on requests in flight), and the run waits until placement.json shows it restarted. The output
    directory, the run's console output and the killed pid. (One run for both: a start-up is most of its cost.)"""
    out = tmp_path_factory.mktemp("plugin-run")
    cmd = loop_command(
        tiny_qwen3, task, out, "--custom-generate-function-path", "tagging_plugin.generate",
        "--custom-rm-path", "tagging_plugin.reward",
        "--dynamic-sampling-filter-path", "rollout.filters.check_reward_nonzero_std",
        "--rollout-num-gpus", "2", "--check-weight-update", "--use-fault-tolerance",
        "--rollout-health-check-interval", "1", "--rollout-health-check-timeout", "5",
    )  # fmt: skip
    env = loop_env(task)
    env.pop("RAY_ADDRESS", None)
    proc, lines, reader = start_reading(cmd, env)

    def engine_1() -> int:
        return json.loads((out / "run" / "placement.json").read_text())["engines"][1]["pids"][0]

    metrics = out / "run" / "metrics.jsonl"
    try:
        wait_for("the first step", lambda: metrics.exists() and "train/loss" in metrics.read_text(), proc, lines=lines)
        dead = engine_1()
        os.kill(dead, signal.SIGKILL)
        wait_for("placement.json to show the restarted engine", lambda: engine_1() != dead, proc, lines=lines)
        assert psutil.pid_exists(engine_1())
        proc.wait(timeout=600)
        reader.join(30)
    finally:
        proc.kill()
    output = "".join(lines)
    assert proc.returncode == 0, output[-6000:]
    return out, output, dead


def test_generate_and_reward_plugins_and_dynamic_sampling(plugin_run: tuple[Path, str, int]) -> None:
    out, _, _ = plugin_run
    records = records_of(out)
    per_step = trained(out)
    check_steps(records, per_step, 0)
    samples = [s for step in per_step.values() for s in step]
    assert all(s["metadata"]["generated_by"] == "tagging_plugin" for s in samples)
    # Only groups whose rewards differ trained; the others were dropped by the filter and counted.
    assert all(s["group_index"] % 2 == 0 for s in samples)
    assert sorted({s["reward"] for s in samples}) == [0.0, 1.0]
    steps = [r for r in records if "train/loss" in r]
    assert sum(r.get("rollout/groups_dropped", 0) for r in steps) >= NUM_ROLLOUT


def test_an_engine_killed_mid_generation_is_restarted_and_nothing_is_lost(plugin_run: tuple[Path, str, int]) -> None:
    """The same run: one failure, one restart; full batches with no group failed and balanced accounting at every
    step (check_steps, above); every engine, the restarted one included, at the trainer's weights after every
    update."""
    out, output, dead = plugin_run
    assert not psutil.pid_exists(dead) or psutil.Process(dead).status() == psutil.STATUS_ZOMBIE
    assert output.count("failed its health check") == 1, output[-6000:]
    records = records_of(out)
    assert max(r.get("rollout/engines_restarted", 0) for r in records) == 1
    train = [r for r in records if "train/loss" in r]
    assert len(train) == NUM_ROLLOUT
    assert all(r["rollout/groups_trained"] == BATCH and r["rollout/groups_failed"] == 0 for r in train)
    samples = [s for step in trained(out).values() for s in step]
    assert len(samples) == NUM_ROLLOUT * BATCH * N and all(s["status"] in ("completed", "truncated") for s in samples)
    assert output.count("servers match the trainer") >= NUM_ROLLOUT + 1, output[-6000:]  # before step 0, then each
