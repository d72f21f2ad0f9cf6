"""The real loop on a simulated multi-node cluster: real Ray nodes on this machine (a head and three workers, all on
127.0.0.1), trainer ranks on one node and one SGLang engine on each of two others."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from rollout.sglang_client import list_workers
from slime_like.core.secret import API_KEY_ENV
from tests.conftest import REPO_ROOT
from tests.integration.two_engine_job import job, write_task
from tools.simulated_cluster import RAY_ENV, start_cluster

KEY = secrets.token_urlsafe(16)


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_task(tmp_path_factory.mktemp("task"))


@pytest.fixture(scope="module")
def cluster() -> Iterator[SimpleNamespace]:
    """Head (no CPUs: only the driver's light actors), a 2-CPU trainer node and two 1-CPU engine nodes."""
    import ray

    saved = {k: os.environ.get(k) for k in RAY_ENV}
    # The head checks each node every second (Ray's default: 3 s), still marking one dead only after 5 missed checks
    # in a row, each given 10 s: a removed node is known lost in ~5 s rather than ~15 s, a slow one is not.
    c, (trainer, *engines) = start_cluster([2, 1, 1], system_config={"health_check_period_ms": 1000})
    try:
        ray.init(address=c.address)  # this process reads Ray's actor table
        yield SimpleNamespace(cluster=c, trainer=trainer, engines=engines)
    finally:
        ray.shutdown()
        c.shutdown()
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)


def start(cmd: list[str], task: Path, ray_address: str | None) -> subprocess.Popen[str]:
    """Start the driver; the run's secret is ours, so this process can ask its router too."""
    env = {**os.environ, **RAY_ENV, "PYTHONPATH": f"{task}:{REPO_ROOT}", "OMP_NUM_THREADS": "1", API_KEY_ENV: KEY}
    env.pop("RAY_ADDRESS", None)
    if ray_address:
        env["RAY_ADDRESS"] = ray_address
    return subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen[str], timeout: float = 600) -> str:
    output, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, output[-6000:]
    return output


def wait_for_placement(out: Path, proc: subprocess.Popen[str], timeout: float = 300) -> dict:
    """The placement the run wrote once its engines and trainer ranks were up."""
    deadline = time.monotonic() + timeout
    path = out / "placement.json"
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before placing anything:\n{proc.stdout.read()[-6000:]}")
        assert time.monotonic() < deadline, "no placement.json"
        time.sleep(1)
    return json.loads(path.read_text())


def metrics(out: Path) -> list[dict]:
    """Per step, what does not depend on timing."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    timing = ("time/", "tokens_per_s", "_time", "/time", "throughput")
    return [{k: v for k, v in r.items() if not any(t in k for t in timing)} for r in records]


def raylet_pid(node: object) -> int:
    return node.all_processes["raylet"][0].process.pid  # type: ignore[attr-defined]


def test_loop_places_trainer_and_engines_on_their_nodes(
    cluster: SimpleNamespace,
    delta_run_on_one_node: SimpleNamespace,
    tiny_qwen3: Path,
    task: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ray._private import state

    monkeypatch.setenv(API_KEY_ENV, KEY)
    proc = start(job(tiny_qwen3, task, tmp_path / "cluster"), task, cluster.cluster.address)
    try:
        placed = wait_for_placement(tmp_path / "cluster", proc)
        # Trainer ranks on the 2-CPU node, one engine on each 1-CPU node, from the run's own record ...
        assert {r["node"] for r in placed["trainer"]} == {cluster.trainer.node_id}
        engine_nodes = [e["nodes"] for e in placed["engines"]]
        assert sorted(n for nodes in engine_nodes for n in nodes) == sorted(n.node_id for n in cluster.engines)
        # ... and from Ray's own actor table: each engine actor runs on its node, and its SGLang process is that
        # actor's child, under the node's raylet.
        alive = [a for a in state.actors().values() if a["State"] == "ALIVE"]
        engine_actors = {a["Address"]["NodeID"]: a["Pid"] for a in alive if a["ActorClassName"] == "EngineNode"}
        trainer_nodes = [a["Address"]["NodeID"] for a in alive if a["ActorClassName"] == "TrainActor"]
        assert trainer_nodes == [cluster.trainer.node_id] * 2
        raylets = {n.node_id: raylet_pid(n) for n in cluster.engines}
        for engine in placed["engines"]:
            node, sglang_pid = engine["nodes"][0], engine["pids"][0]
            actor_pid = engine_actors[node]
            assert psutil.Process(sglang_pid).ppid() == actor_pid
            assert raylets[node] in [p.pid for p in psutil.Process(actor_pid).parents()]
        # The router (on the driver's node) routes to both engines.
        urls = {e["url"] for e in placed["engines"]}
        assert {w["url"] for w in list_workers(placed["router"]["url"])} == urls
        output = finish(proc)
    finally:
        proc.kill()
    # Weights reached both engines: the post-update check ran (and passed) on both after every update.
    assert output.count("servers match the trainer") >= 3, output[-4000:]
    on_cluster = metrics(tmp_path / "cluster")
    assert [r["step"] for r in on_cluster if "train/loss" in r] == [0, 1]

    # The same job on one node (a local Ray instance; weights sent as deltas from disk, the session's run that
    # test_delta_weight_sync.py checks too): the same numbers.
    on_one_node = metrics(delta_run_on_one_node.out)
    assert on_cluster[0].keys() == on_one_node[0].keys()
    for a, b in zip(on_cluster, on_one_node, strict=True):
        for key, value in a.items():
            assert b[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert any(r.get("train/grad_norm", 0) > 0 for r in on_cluster)  # it learned something: the check was real


def test_tensor_transport_across_nodes_is_refused_before_anything_starts(
    cluster: SimpleNamespace, tiny_qwen3: Path, task: Path, tmp_path: Path
) -> None:
    cmd = job(tiny_qwen3, task, tmp_path / "tensor", "--update-weight-transport", "tensor")
    proc = start(cmd, task, cluster.cluster.address)
    output, _ = proc.communicate(timeout=180)
    assert proc.returncode != 0
    assert "--update-weight-transport tensor (or --update-weight-fallback tensor) hands tensors over" in output
    assert "would run on another node than trainer rank 0" in output
    assert not (tmp_path / "tensor" / "placement.json").exists()  # no engine or trainer rank was started


def test_an_engine_spans_two_nodes_until_a_node_is_lost(
    cluster: SimpleNamespace, tiny_qwen3: Path, task: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One engine of two ranks (SGLang's CPU engine runs a TP rank per process) over the two 1-CPU nodes, in the
    one-step-ahead loop: node rank 1 joins node rank 0's rendezvous, and weight updates (from disk: the simulated
    nodes share a filesystem, which the run checks) reach both ranks. Then one of its nodes is removed: the run
    stops in bounded time naming the node and the engine. Last in this module: it removes a node of the cluster."""
    monkeypatch.setenv(API_KEY_ENV, KEY)
    out = tmp_path / "wide"
    cmd = job(
        tiny_qwen3, task, out, "--rollout-num-gpus-per-engine", "2", "--num-gpus-per-node", "2",
        "--update-weight-transport", "disk", "--save-debug-rollout-data", "--num-rollout", "200",
        module="slime_like.train_async",
    )  # fmt: skip
    proc = start(cmd, task, cluster.cluster.address)
    try:
        placed = wait_for_placement(out, proc)
        [engine] = placed["engines"]
        assert sorted(engine["nodes"]) == sorted(n.node_id for n in cluster.engines)
        assert all(psutil.pid_exists(pid) for pid in engine["pids"])
        assert [w["url"] for w in list_workers(placed["router"]["url"])] == [engine["url"]]
        deadline = time.monotonic() + 300
        while len([r for r in metrics(out) if "train/loss" in r] if (out / "metrics.jsonl").exists() else []) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "no two steps"
            time.sleep(0.5)
        victim = cluster.engines[1]
        cluster.cluster.remove_node(victim, allow_graceful=False)
        removed = time.monotonic()
        output, _ = proc.communicate(timeout=120)
        stopped = time.monotonic() - removed
        print(f"stopped {stopped:.1f} s after the node was removed")
    finally:
        proc.kill()
    # Each node's process was started as its node rank of a two-node engine (the command heads its log).
    ranks = [re.search(r"--nnodes 2 --node-rank (\d)", f.read_text())[1] for f in (out / "logs").glob("sglang_*.log")]
    assert sorted(ranks) == ["0", "1"]
    # One step ahead: rollout 1 was generated while rollout 0 trained, so both ran on weight version 0.
    dumps = sorted((out / "rollouts").glob("rollout_*.jsonl"))[:2]
    versions = [{json.loads(line)["weight_version"] for line in f.read_text().splitlines()} for f in dumps]
    assert versions == [{0}, {0}]
    first = next(r for r in metrics(out) if "train/loss" in r)
    assert first["train/train_rollout_logprob_abs_diff"] < 1e-4  # the two-rank engine agrees with Megatron
    # Before the first rollout and after each of the two updates, both ranks matched the trainer.
    assert output.count("servers match the trainer") >= 3, output[-4000:]
    # The lost node stopped the run, named with what it held; its SGLang process went with it.
    assert proc.returncode != 0
    errors = "\n".join(line for line in output.splitlines() if "Error" in line)[-4000:]
    assert "NodeLostError" in output and victim.node_id[:8] in output and "engine 0" in output, errors
    assert stopped < 90, f"took {stopped:.0f} s to stop"
    rank = engine["nodes"].index(victim.node_id)
    assert not psutil.pid_exists(engine["pids"][rank])
