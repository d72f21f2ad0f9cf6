"""Trainer faults in a real run (Ray, SGLang, the router, Megatron on two gloo ranks): a trainer rank killed while
training, or while the ranks wait out a long rollout, stops the run within a minute with one error naming the rank,
its node and the checkpoint to resume from; the whole job killed while a checkpoint is written resumes from the
checkpoint before it. Both resumed runs end where an uninterrupted run ends: the same metrics at every resumed step,
the same samples and the same weights."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from slime_like.trainer.megatron import checkpoint_layout as layout
from tests.conftest import REPO_ROOT
from tests.integration.same_run import assert_same_metrics, assert_same_samples, assert_same_weights

# About 7 minutes on 2 cores: run with `bash scripts/test.sh -m slow`.
pytestmark = pytest.mark.slow

NUM_ROLLOUT = 4
SAVE_INTERVAL = 2  # checkpoints after rollouts 1 and 3: iter_0000001, iter_0000003

# Deterministic and spread out (as tests/integration/test_multinode.py): greedy responses (top-k 1), rewards that
# differ between prompts and a batch-normalised estimator, so every step has a loss and a gradient to compare.
REWARD_PLUGIN = """
def reward(args, sample):
    return float(sum(sample.tokens) % 3)
"""


# Rollout 2 (its first sample is number 8) takes 5 minutes, after touching `held`: the trainer ranks sit idle
# meanwhile, as they do through a long rollout on GPU.
HOLD_PLUGIN = """
import asyncio
from pathlib import Path

from rollout.generate import generate as default_generate

HERE = Path(__file__).parent


async def generate(ctx, sample, sampling_params):
    if sample.index >= 8 and not ctx.evaluation:
        (HERE / "held").touch()
        for _ in range(1500):
            await asyncio.sleep(0.2)
    return await default_generate(ctx, sample, sampling_params)
"""


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("task")
    rows = [{"prompt": f"{a}+{a}=", "label": str(2 * a)} for a in range(8)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "spread_rm.py").write_text(REWARD_PLUGIN)
    (root / "hold_generate.py").write_text(HOLD_PLUGIN)
    return root


def job(model: Path, task: Path, out: Path, save: Path, *extra: str) -> list[str]:
    """The sync loop, colocated: two trainer ranks (DP=2 on gloo) and one engine, a checkpoint every 2 rollouts."""
    return [
        sys.executable, "-m", "slime_like.train",
        "--hf-checkpoint", str(model), "--prompt-data", str(task / "train.jsonl"), "--rollout-shuffle",
        "--input-key", "prompt", "--label-key", "label",
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", str(NUM_ROLLOUT),
        "--rollout-max-response-len", "3", "--rollout-top-k", "1",
        "--advantage-estimator", "reinforce_plus_plus", "--custom-rm-path", "spread_rm.reward",
        "--colocate", "--actor-num-gpus-per-node", "2", "--lr", "1e-2",
        "--save", str(save), "--save-interval", str(SAVE_INTERVAL),
        "--eval-prompt-data", str(task / "train.jsonl"), "--eval-interval", str(NUM_ROLLOUT),
        "--save-debug-rollout-data", "--output-dir", str(out), "--ray-num-cpus", "4", *extra,
    ]  # fmt: skip


def start(cmd: list[str], task: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": f"{task}:{REPO_ROOT}", "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as sink:  # a file, not a pipe: nobody reads while the run goes on
        return subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, stdout=sink, stderr=subprocess.STDOUT)


def run(cmd: list[str], task: Path, log: Path) -> str:
    proc = start(cmd, task, log)
    try:
        proc.wait(timeout=600)
    finally:
        proc.kill()
    output = log.read_text()
    assert proc.returncode == 0, output[-6000:]
    return output


def wait_for(what: str, done: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path, poll: float) -> None:
    deadline = time.monotonic() + 300
    while not done():
        assert proc.poll() is None, f"the run ended while waiting for {what}:\n{log.read_text()[-6000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{log.read_text()[-6000:]}"
        time.sleep(poll)


def assert_same_run(resumed: Path, save: Path, reference: tuple[Path, Path]) -> None:
    """Resumed at rollout 2, it logged rollouts 2 and 3 and the final evaluation as the reference run did, trained
    on the same samples and saved the same weights."""
    ref_out, ref_save = reference
    assert_same_metrics(resumed, ref_out, [2, 3, NUM_ROLLOUT])
    assert_same_samples(resumed, ref_out, [2, 3])
    assert_same_weights(save / "iter_0000003", ref_save / "iter_0000003")


@pytest.fixture(scope="module")
def reference(tiny_qwen3: Path, task: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The uninterrupted run: its output directory and its checkpoints."""
    root = tmp_path_factory.mktemp("reference")
    run(job(tiny_qwen3, task, root / "run", root / "ckpt"), task, root / "run.log")
    return root / "run", root / "ckpt"


def kill_rank_1(out: Path, proc: subprocess.Popen[str], log: Path) -> tuple[str, str]:
    """SIGKILL trainer rank 1 (its pid from the run's placement.json) and check the run stopped, failing, within
    60 s; the run's output and the start of the error that names the rank, its node and process."""
    victim = json.loads((out / "placement.json").read_text())["trainer"][1]
    os.kill(victim["pid"], signal.SIGKILL)
    killed = time.monotonic()
    proc.wait(timeout=120)
    stopped = time.monotonic() - killed
    output = log.read_text()
    print(f"stopped {stopped:.1f} s after the kill")
    assert proc.returncode != 0 and stopped < 60, output[-6000:]
    node = f"{victim['address']}/{victim['node'][:8]}"
    return output, f"TrainerRankLostError: trainer rank 1 (node {node}, pid {victim['pid']})"


def test_a_killed_trainer_rank_stops_the_run_and_a_resume_ends_where_the_run_would_have(
    reference: tuple[Path, Path], tiny_qwen3: Path, task: Path, tmp_path: Path
) -> None:
    out, save, log = tmp_path / "killed", tmp_path / "ckpt", tmp_path / "killed.log"
    proc = start(job(tiny_qwen3, task, out, save), task, log)
    try:
        # Rollout 2 generated (iter_0000001 was saved after rollout 1): the ranks are training it now.
        wait_for("rollout 2", lambda: (out / "rollouts" / "rollout_000002.jsonl").exists(), proc, log, 0.05)
        output, named = kill_rank_1(out, proc, log)
    finally:
        proc.kill()
    # One error, naming the rank, its node and process, and the checkpoint to resume from.
    assert named in output, output[-6000:]
    resume = f"The last complete checkpoint is {save / 'iter_0000001'}: resume with --load {save}."
    assert resume in output, output[-6000:]
    assert "Traceback" in output and output.count("TrainerRankLostError:") == 1, output[-6000:]

    resumed = tmp_path / "resumed"
    output = run(job(tiny_qwen3, task, resumed, save, "--load", str(save)), task, tmp_path / "resumed.log")
    assert f"resumed from {save / 'iter_0000001'} at rollout 2" in output
    assert_same_run(resumed, save, reference)


def test_a_job_killed_while_saving_resumes_from_the_checkpoint_before(
    reference: tuple[Path, Path], tiny_qwen3: Path, task: Path, tmp_path: Path
) -> None:
    out, save, log = tmp_path / "killed", tmp_path / "ckpt", tmp_path / "killed.log"
    cut_off = layout.temporary_dir(save, 3)
    proc = start(job(tiny_qwen3, task, out, save), task, log)
    job_processes: list[psutil.Process] = []
    try:
        wait_for("the first step", lambda: (out / "metrics.jsonl").exists(), proc, log, 0.5)
        job_processes = psutil.Process(proc.pid).children(recursive=True)  # Ray, its workers, SGLang, the router
        # The save after rollout 3 writes into iter_0000003.tmp: kill the whole job (its driver) inside that window.
        wait_for("the save of iter_0000003", cut_off.exists, proc, log, 0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        # The processes that hold devices and ports die with their driver (PDEATHSIG, Ray's fate sharing).
        placed = json.loads((out / "placement.json").read_text())
        pids = [r["pid"] for r in placed["trainer"]] + placed["engines"][0]["pids"] + [placed["router"]["pid"]]
        watched = [p for p in job_processes if p.pid in pids]
        assert len(watched) == len(pids), (pids, job_processes)
        _, alive = psutil.wait_procs(watched, timeout=30)
        assert alive == [], f"outlived their driver: {alive}"
    finally:
        proc.kill()
        for leftover in psutil.wait_procs(job_processes, timeout=10)[1]:  # Ray's agents may take longer: sweep
            leftover.kill()
    assert cut_off.exists() and not (save / "iter_0000003").exists()  # cut off inside the save
    assert layout.read_tracker(save) == 1

    resumed = tmp_path / "resumed"
    output = run(job(tiny_qwen3, task, resumed, save, "--load", str(save)), task, tmp_path / "resumed.log")
    assert f"resumed from {save / 'iter_0000001'} at rollout 2" in output
    assert not cut_off.exists() and layout.read_tracker(save) == 3
    assert_same_run(resumed, save, reference)


def test_a_trainer_rank_killed_during_a_long_rollout_stops_the_run_before_the_rollout_ends(
    tiny_qwen3: Path, task: Path, tmp_path: Path
) -> None:
    out, save, log = tmp_path / "killed", tmp_path / "ckpt", tmp_path / "killed.log"
    held = task / "held"
    held.unlink(missing_ok=True)
    cmd = job(tiny_qwen3, task, out, save, "--custom-generate-function-path", "hold_generate.generate")
    proc = start(cmd, task, log)
    try:
        wait_for("rollout 2 to be held", held.exists, proc, log, 0.2)
        output, named = kill_rank_1(out, proc, log)
    finally:
        proc.kill()
    # Noticed while the driver waited for the rollout (not at the next trainer call, minutes later).
    assert named + " died while rollout 2 generated" in output, output[-6000:]
    assert f"The last complete checkpoint is {save / 'iter_0000001'}: resume with --load {save}." in output
