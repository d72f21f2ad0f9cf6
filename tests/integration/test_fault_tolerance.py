"""Faults injected into a real run (Ray, two SGLang engines, the router, Megatron) with --use-fault-tolerance: an
engine killed, then one hung (SIGSTOP); the router killed while it carries a rollout's requests. The run finishes
with every sample accounted for and every engine at the trainer's weights. Also the router's restart on its own and
the error a dead router gives without fault tolerance."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import requests

from rollout.generate import prompt_token_ids
from rollout.manager import RolloutManager
from rollout.router import SGLangRouter
from rollout.sglang_client import generate
from rollout.sglang_server import SGLangServer
from slime_like.arguments import parse_args
from slime_like.core.errors import EngineError
from slime_like.core.secret import API_KEY_ENV
from tests.conftest import REPO_ROOT

BATCH, N = 4, 4  # prompts per rollout, samples per prompt

# In CI (about 2.5 minutes): the killed-and-hung engines and the dead router without fault tolerance. The rest,
# about 3 more minutes, stays `slow` (`bash scripts/test.sh -m slow`): the suite must stay under 35 minutes.


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("task")
    rows = [{"prompt": f"{a}+{a}=", "label": str(2 * a)} for a in range(8)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def wait_for(
    what: str, done: object, proc: subprocess.Popen[str], timeout: float = 300, lines: list[str] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while not done():  # type: ignore[operator]
        if proc.poll() is not None:
            output = "".join(lines) if lines is not None else proc.stdout.read()  # type: ignore[union-attr]
            raise AssertionError(f"the run ended while waiting for {what}:\n{output[-6000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def steps_done(out: Path) -> int:
    path = out / "metrics.jsonl"
    return sum(1 for line in path.read_text().splitlines() if "train/loss" in line) if path.exists() else 0


def test_a_killed_and_a_hung_engine_are_restarted_and_nothing_is_lost(
    tiny_qwen3: Path, task: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "slime_like.train", "--hf-checkpoint", str(tiny_qwen3),
        "--prompt-data", str(task / "train.jsonl"), "--input-key", "prompt", "--label-key", "label",
        "--rollout-batch-size", str(BATCH), "--n-samples-per-prompt", str(N), "--num-rollout", "8",
        "--rollout-max-response-len", "24", "--rollout-num-gpus", "2", "--lr", "1e-3",
        "--use-fault-tolerance", "--rollout-health-check-interval", "1", "--rollout-health-check-timeout", "5",
        "--check-weight-update", "--save-debug-rollout-data", "--output-dir", str(out), "--ray-num-cpus", "4",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", API_KEY_ENV: secrets.token_urlsafe(8)}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for("the first step", lambda: steps_done(out) >= 1, proc)
        killed = json.loads((out / "placement.json").read_text())["engines"][1]["pids"][0]
        os.kill(killed, signal.SIGKILL)
        wait_for("the third step", lambda: steps_done(out) >= 3, proc)
        # The restarted engine 1 is serving again; now hang engine 0 (it stops answering, its process stays).
        hung = json.loads((out / "placement.json").read_text())["engines"][0]["pids"][0]
        os.kill(hung, signal.SIGSTOP)
        output, _ = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, output[-6000:]
    assert output.count("failed its health check") == 2, output[-6000:]
    assert not psutil.pid_exists(hung) or psutil.Process(hung).status() == psutil.STATUS_ZOMBIE
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(r.get("rollout/engines_restarted", 0) for r in records) == 2
    # Every rollout trained all its groups: none failed, none lost (the accounting balanced at every rollout).
    train = [r for r in records if "train/loss" in r]
    assert len(train) == 8
    assert all(r["rollout/groups_trained"] == BATCH and r["rollout/groups_failed"] == 0 for r in train)
    dumps = sorted((out / "rollouts").glob("rollout_*.jsonl"))
    samples = [[json.loads(line) for line in f.read_text().splitlines()] for f in dumps]
    assert [len(s) for s in samples] == [BATCH * N] * 8
    assert all(s["status"] in ("completed", "truncated") for r in samples for s in r)
    # Every engine, restarted ones included, matched the trainer after every update.
    assert output.count("servers match the trainer") >= 9, output[-6000:]  # before the first rollout, then 8


@pytest.mark.slow
def test_fully_async_an_engine_killed_mid_generation_is_restarted_and_nothing_is_lost(
    tiny_qwen3: Path, task: Path, tmp_path: Path
) -> None:
    """--fully-async generates all the time, so the kill always lands on requests in flight."""
    out = tmp_path / "run"
    cmd = run_command(
        tiny_qwen3, task, out, 6, "--use-fault-tolerance", "--rollout-health-check-interval", "1",
        "--rollout-health-check-timeout", "5", "--fully-async", "--max-weight-staleness", "2",
    )  # fmt: skip
    cmd[cmd.index("slime_like.train")] = "slime_like.train_async"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", API_KEY_ENV: secrets.token_urlsafe(8)}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def engine_1() -> int:
        return json.loads((out / "placement.json").read_text())["engines"][1]["pids"][0]

    try:
        wait_for("the first step", lambda: steps_done(out) >= 1, proc)
        dead = engine_1()
        os.kill(dead, signal.SIGKILL)
        wait_for("placement.json to show the restarted engine", lambda: engine_1() != dead, proc)
        assert psutil.pid_exists(engine_1())
        output, _ = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, output[-6000:]
    assert output.count("failed its health check") == 1, output[-6000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(r.get("rollout/engines_restarted", 0) for r in records) == 1
    train = [r for r in records if "train/loss" in r]
    assert len(train) == 6
    # Full batches, no group failed; the carried accounting balanced at every step (the ledger checks it too).
    for r in train:
        assert r["rollout/groups_trained"] == BATCH and r["rollout/groups_failed"] == 0
        assert r["rollout/staleness_max"] <= 2
        drawn = r["rollout/groups_drawn_source"] + r["rollout/groups_drawn_buffer"] + r["rollout/groups_drawn_carried"]
        settled = sum(r[f"rollout/groups_{k}"] for k in ("trained", "failed", "dropped", "returned", "carried"))
        assert drawn == settled
    samples = [json.loads(line) for f in sorted((out / "rollouts").glob("rollout_*.jsonl")) for line in f.open()]
    assert len(samples) == 6 * BATCH * N and all(s["status"] in ("completed", "truncated") for s in samples)
    assert output.count("servers match the trainer") >= 7, output[-6000:]  # before the first step, then 6


def run_command(model: Path, task: Path, out: Path, rollouts: int, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "slime_like.train", "--hf-checkpoint", str(model),
        "--prompt-data", str(task / "train.jsonl"), "--input-key", "prompt", "--label-key", "label",
        "--rollout-batch-size", str(BATCH), "--n-samples-per-prompt", str(N), "--num-rollout", str(rollouts),
        "--rollout-max-response-len", "24", "--rollout-num-gpus", "2", "--lr", "1e-3",
        "--check-weight-update", "--save-debug-rollout-data", "--output-dir", str(out), "--ray-num-cpus", "4", *extra,
    ]  # fmt: skip


def killed(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["process", "actor"])
def test_a_router_killed_mid_rollout_is_restarted_on_its_port_and_nothing_is_lost(
    victim: str, tiny_qwen3: Path, task: Path, tmp_path: Path
) -> None:
    """The router's process, or the Ray actor that runs it (and the process with it: a new actor takes over)."""
    out, rollouts = tmp_path / "run", 4
    # Engine checks every 120 s: only the wake of the first failed request can restart the router within the
    # requests' retry window (about 50 s), so a sample would fail if that did not work.
    cmd = run_command(
        tiny_qwen3, task, out, rollouts, "--use-fault-tolerance", "--rollout-health-check-interval", "120"
    )
    key = secrets.token_urlsafe(8)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", API_KEY_ENV: key}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        wait_for("the first step", lambda: steps_done(out) >= 1, proc, lines=lines)
        placement = json.loads((out / "placement.json").read_text())
        router_url, router_pid = placement["router"]["url"], placement["router"]["pid"]
        # A rollout is generating once the check after the first update is done (the trainer's log file has it at
        # once; its console line reaches us late) and an engine holds requests (nothing else sends them /generate
        # in between: no eval here).
        urls = [e["url"] for e in placement["engines"]]
        headers = {"Authorization": f"Bearer {key}"}
        trainer_log = out / "logs" / "trainer_rank0.log"

        def generating() -> bool:
            if "servers match the trainer" not in trainer_log.read_text(errors="replace"):
                return False
            loads = [requests.get(f"{u}/get_load", headers=headers, timeout=5).json() for u in urls]
            return any(r["num_reqs"] for load in loads for r in load)

        deadline = time.monotonic() + 300
        while not generating():
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)[-6000:]
            time.sleep(0.01)
        actor = psutil.Process(router_pid).parent()
        assert actor is not None and "RouterHost" in " ".join(actor.cmdline()), actor
        os.kill(router_pid if victim == "process" else actor.pid, signal.SIGKILL)
        proc.wait(timeout=600)
        reader.join(30)
    finally:
        proc.kill()
    output = "".join(lines)
    assert proc.returncode == 0, output[-6000:]
    assert killed(router_pid)
    restarts = [line for line in output.splitlines() if "router restarted at" in line]
    assert len(restarts) == 1 and f"sglang-router at {router_url} failed" in restarts[0], output[-6000:]
    assert f"router restarted at {router_url} with 2 engine(s)" in restarts[0]  # same port; both engines back
    assert ("died with its Ray actor" in restarts[0]) == (victim == "actor"), restarts[0]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "train/loss" in r]
    assert len(train) == rollouts
    # Requests were cut off and sent again in one rollout (1, unless it ended before the load was seen), the one
    # that restarted the router; later ones went through the new router.
    hit = [i for i, r in enumerate(train) if r.get("rollout/generate_retries", 0)]
    assert len(hit) == 1 and 1 <= hit[0] <= rollouts - 2, hit
    assert [r["rollout/router_restarts"] for r in train] == [0] * hit[0] + [1] * (rollouts - hit[0])
    # Every rollout trained its whole batch, nothing failed, and the accounting balanced.
    for r in train:
        assert r["rollout/groups_trained"] == BATCH and r["rollout/groups_failed"] == 0
        settled = sum(r.get(f"rollout/groups_{k}", 0) for k in ("trained", "failed", "dropped", "returned"))
        assert r["rollout/groups_drawn"] == settled
    # Each sample holds its prompt and one answer's tokens, appended once.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3)
    dumps = sorted((out / "rollouts").glob("rollout_*.jsonl"))
    samples = [[json.loads(line) for line in f.read_text().splitlines()] for f in dumps]
    assert [len(s) for s in samples] == [BATCH * N] * rollouts
    for s in (s for r in samples for s in r):
        assert s["status"] in ("completed", "truncated")
        prompt = prompt_token_ids(tokenizer, s["prompt"])
        assert s["tokens"][: len(prompt)] == prompt and len(s["tokens"]) == len(prompt) + s["response_length"]
        assert (
            0 < s["response_length"] <= 24
            and len(s["loss_mask"]) == len(s["rollout_log_probs"]) == s["response_length"]
        )
    assert output.count("servers match the trainer") >= rollouts + 1, output[-6000:]  # before the first, then each


@pytest.mark.slow
def test_router_restarts_on_its_port_and_moves_when_the_port_is_taken(
    sglang_server: SGLangServer, tmp_path: Path
) -> None:
    router = SGLangRouter([sglang_server.url], policy="round_robin", log_dir=tmp_path, stop_timeout=3).start()

    def kill() -> None:
        process = router.process
        assert process is not None and process.pid is not None
        os.kill(process.pid, signal.SIGKILL)
        while process.returncode is None:
            time.sleep(0.01)  # the signal is delivered asynchronously

    def serves() -> bool:
        assert [(w["url"], w["is_healthy"]) for w in router.list_workers()] == [(sglang_server.url, True)]
        return bool(generate(router.url, [1, 2, 3], {"max_new_tokens": 2, "temperature": 0.0})["output_ids"])

    try:
        url, pid = router.url, router.process.pid  # type: ignore[union-attr]
        kill()
        assert router.restart([sglang_server.url]) == -signal.SIGKILL
        assert router.url == url and router.process.pid != pid and serves()  # type: ignore[union-attr]
        # Hung: stopped (SIGTERM, then SIGKILL), and its port is taken again.
        os.kill(router.process.pid, signal.SIGSTOP)  # type: ignore[union-attr]
        assert router.restart([sglang_server.url]) is None  # it was still running
        assert router.url == url and serves()
        # Dead, and another process took its port meanwhile: the new router moves to a free one.
        kill()
        with socket.socket() as holder:
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: TIME_WAIT is no obstacle
            holder.bind(("127.0.0.1", router.port))  # type: ignore[arg-type]
            holder.listen()
            assert router.restart([sglang_server.url]) == -signal.SIGKILL
            assert router.url != url and serves()
    finally:
        router.stop()


def test_without_fault_tolerance_a_dead_router_fails_the_rollout_naming_it(
    tiny_qwen3: Path, task: Path, sglang_server: SGLangServer, tmp_path: Path
) -> None:
    args = parse_args(
        [
            "--hf-checkpoint", str(tiny_qwen3), "--prompt-data", str(task / "train.jsonl"), "--input-key", "prompt",
            "--label-key", "label", "--rollout-batch-size", "1", "--n-samples-per-prompt", "2",
            "--rollout-max-response-len", "4", "--num-rollout", "1", "--output-dir", str(tmp_path),
        ]
    )  # fmt: skip
    manager = RolloutManager(args, server_urls=[sglang_server.url])  # it starts its own router
    try:
        info = manager.router_info()
        os.kill(info["pid"], signal.SIGKILL)
        with pytest.raises(EngineError, match=rf"rollout 0: sglang-router at {info['url']} exited with code -9"):
            manager.generate(0)
    finally:
        manager.shutdown()
