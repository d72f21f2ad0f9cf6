"""Faults injected into a real run (Ray, two SGLang engines, the router, Megatron) with --use-fault-tolerance: an
engine killed, then one hung (SIGSTOP); the router's Ray actor killed, then its process, each while it carries a
rollout's requests. The run finishes with every sample accounted for and every engine at the trainer's weights. Also
the router's restart on its own and the error a dead router gives without fault tolerance. An engine killed under
--fully-async is in tests/integration/test_fully_async.py, in that file's plugin run."""

from __future__ import annotations

import contextlib
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


def start_reading(cmd: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], list[str], threading.Thread]:
    """Start a run from the repository root, its console lines collected as they come by a reader thread (the test
    waits on files meanwhile; an unread pipe would fill and stop the run)."""
    proc = subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    return proc, lines, reader


def steps_done(out: Path) -> int:
    path = out / "metrics.jsonl"
    return sum(1 for line in path.read_text().splitlines() if "train/loss" in line) if path.exists() else 0


def test_a_killed_and_a_hung_engine_are_restarted_and_nothing_is_lost(
    tiny_qwen3: Path, task: Path, tmp_path: Path
) -> None:
    """Engine 1 killed after the first step; engine 0 hung once the third is logged: three rollouts remain."""
    out, rollouts = tmp_path / "run", 6
    cmd = [
        sys.executable, "-m", "slime_like.train", "--hf-checkpoint", str(tiny_qwen3),
        "--prompt-data", str(task / "train.jsonl"), "--input-key", "prompt", "--label-key", "label",
        "--rollout-batch-size", str(BATCH), "--n-samples-per-prompt", str(N), "--num-rollout", str(rollouts),
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
    assert len(train) == rollouts
    assert all(r["rollout/groups_trained"] == BATCH and r["rollout/groups_failed"] == 0 for r in train)
    dumps = sorted((out / "rollouts").glob("rollout_*.jsonl"))
    samples = [[json.loads(line) for line in f.read_text().splitlines()] for f in dumps]
    assert [len(s) for s in samples] == [BATCH * N] * rollouts
    assert all(s["status"] in ("completed", "truncated") for r in samples for s in r)
    # Every engine, restarted ones included, matched the trainer after every update.
    assert output.count("servers match the trainer") >= rollouts + 1, output[-6000:]  # before the first, then each


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


def router_host(driver: subprocess.Popen[str], old: set[int]) -> psutil.Process:
    """The run's live RouterHost actor process (a descendant of its driver: the local Ray instance's worker), other
    than the `old` ones."""
    for p in psutil.Process(driver.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.pid not in old and "RouterHost" in " ".join(p.cmdline()) and not killed(p.pid):
                return p
    raise AssertionError(f"no live RouterHost actor under the driver (other than {old})")


def test_a_router_killed_mid_rollout_is_restarted_on_its_port_and_nothing_is_lost(
    tiny_qwen3: Path, task: Path, tmp_path: Path
) -> None:
    """In one run: the Ray actor that runs the router killed (the router process dies with it: a new actor takes
    over) while rollout 1 generates, then the new router's process alone while rollout 3 generates."""
    out, rollouts = tmp_path / "run", 6
    # Engine checks every 120 s: only the wake of the first failed request can restart the router within the
    # requests' retry window (about 50 s), so a sample would fail if that did not work.
    cmd = run_command(
        tiny_qwen3, task, out, rollouts, "--use-fault-tolerance", "--rollout-health-check-interval", "120"
    )
    key = secrets.token_urlsafe(8)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", API_KEY_ENV: key}
    env.pop("RAY_ADDRESS", None)
    proc, lines, reader = start_reading(cmd, env)
    try:
        wait_for("the first step", lambda: steps_done(out) >= 1, proc, lines=lines)
        placement = json.loads((out / "placement.json").read_text())
        router_url, first_pid = placement["router"]["url"], placement["router"]["pid"]
        urls = [e["url"] for e in placement["engines"]]
        headers = {"Authorization": f"Bearer {key}"}
        trainer_log = out / "logs" / "trainer_rank0.log"

        def updated(version: int) -> bool:
            """The check after the update to `version` is done (the trainer's log file has it at once; its console
            line reaches us late): rollout `version` generates next."""
            return f"weight version {version} over" in trainer_log.read_text(errors="replace")

        def kill_while_generating(rollout: int, pid: int) -> None:
            """SIGKILL `pid` once rollout `rollout` generates: its weights are in and an engine holds requests
            (nothing else sends them /generate in between: no eval here)."""
            deadline = time.monotonic() + 300
            while True:
                assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)[-6000:]
                if updated(rollout):
                    loads = [requests.get(f"{u}/get_load", headers=headers, timeout=5).json() for u in urls]
                    if any(r["num_reqs"] for load in loads for r in load):
                        break
                time.sleep(0.01)
            os.kill(pid, signal.SIGKILL)

        first_actor = psutil.Process(first_pid).parent()
        assert first_actor is not None and "RouterHost" in " ".join(first_actor.cmdline()), first_actor
        kill_while_generating(1, first_actor.pid)
        # The first restart is done before rollout 3 generates: the new actor's router serves on the same port.
        wait_for("the update before rollout 3", lambda: updated(3), proc, lines=lines)
        second_actor = router_host(proc, {first_actor.pid})
        [second] = second_actor.children()
        kill_while_generating(3, second.pid)
        proc.wait(timeout=600)
        reader.join(30)
    finally:
        proc.kill()
    output = "".join(lines)
    assert proc.returncode == 0, output[-6000:]
    assert killed(first_pid) and killed(first_actor.pid) and killed(second.pid)
    restarts = [line for line in output.splitlines() if "router restarted at" in line]
    assert len(restarts) == 2, output[-6000:]
    for line in restarts:
        assert f"sglang-router at {router_url} failed" in line, line
        assert f"router restarted at {router_url} with 2 engine(s)" in line  # same port; both engines back
    assert "died with its Ray actor" in restarts[0] and "died with its Ray actor" not in restarts[1], restarts
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "train/loss" in r]
    assert len(train) == rollouts
    # Requests were cut off and sent again in one rollout per kill (1 and 3, unless one ended before the load was
    # seen), the one that restarted the router; later ones went through the new router.
    hit = [i for i, r in enumerate(train) if r.get("rollout/generate_retries", 0)]
    assert len(hit) == 2 and 1 <= hit[0] < hit[1] <= rollouts - 2, hit
    restarts_seen = [0] * hit[0] + [1] * (hit[1] - hit[0]) + [2] * (rollouts - hit[1])
    assert [r["rollout/router_restarts"] for r in train] == restarts_seen
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
