"""Trainer faults in a real run (Ray, SGLang, the router, Megatron on two gloo ranks): a trainer rank killed while
training, or while the ranks wait out a long rollout, stops the run within a minute with one error naming the rank,
its node and the checkpoint to resume from; the whole job killed while a checkpoint is written leaves the checkpoint
before it. The resumed run ends where an uninterrupted run ends: the same metrics at every resumed step, the same
samples and the same weights.

One chain of runs on one --save directory, since a start-up is most of a run's cost here: the job killed inside the
save of iter_0000003 (iter_0000001 is the last complete checkpoint); resumed from it, a rank killed while rollout 2
is held; resumed again, a rank killed while it trains rollout 2; resumed a last time, to the end, in the other
placement (disaggregated). Each resume starts from iter_0000001, after the failure just before it, with the cut-off
save still on disk."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from slime_like.trainer.megatron import checkpoint_layout as layout
from tests.conftest import REPO_ROOT
from tests.integration.same_run import assert_same_metrics, assert_same_samples, assert_same_weights

NUM_ROLLOUT = 4
SAVE_INTERVAL = 2  # checkpoints after rollouts 1 and 3: iter_0000001, iter_0000003

# Deterministic and spread out (as tests/integration/test_multinode.py): greedy responses (top-k 1), rewards that
# differ between prompts and a batch-normalised estimator, so every step has a loss and a gradient to compare.
REWARD_PLUGIN = """
def reward(args, sample):
    return float(sum(sample.tokens) % 3)
"""


# Rollout 2 (its first sample is number 8) takes 5 minutes, after touching `held`: the trainer ranks sit idle
# meanwhile, as they do through a long rollout on GPU. The test ends the hold (`released`) once the driver has
# stopped the trainer for the killed rank, so that the manager, then no longer mid-rollout, stops at once (else the
# driver gives it 10 s).
HOLD_PLUGIN = """
import asyncio
from pathlib import Path

from rollout.generate import generate as default_generate

HERE = Path(__file__).parent


async def generate(ctx, sample, sampling_params):
    if sample.index >= 8 and not ctx.evaluation:
        (HERE / "held").touch()
        for _ in range(1500):
            if (HERE / "released").exists():
                break
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


def job(model: Path, task: Path, out: Path, save: Path, *extra: str, colocate: bool = True) -> list[str]:
    """The sync loop, colocated: two trainer ranks (DP=2 on gloo) and one engine (--colocate alone would start one
    per trainer slot), a checkpoint every 2 rollouts; or disaggregated (`colocate=False`), the ranks and the engine
    on slots of their own."""
    return [
        sys.executable, "-m", "slime_like.train",
        "--hf-checkpoint", str(model), "--prompt-data", str(task / "train.jsonl"), "--rollout-shuffle",
        "--input-key", "prompt", "--label-key", "label",
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", str(NUM_ROLLOUT),
        "--rollout-max-response-len", "3", "--rollout-top-k", "1",
        "--advantage-estimator", "reinforce_plus_plus", "--custom-rm-path", "spread_rm.reward",
        *(["--colocate"] if colocate else []), "--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "1",
        "--lr", "1e-2", "--save", str(save), "--save-interval", str(SAVE_INTERVAL),
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


@pytest.fixture(scope="module")
def reference(tiny_qwen3: Path, task: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The uninterrupted run: its output directory and its checkpoints."""
    root = tmp_path_factory.mktemp("reference")
    run(job(tiny_qwen3, task, root / "run", root / "ckpt"), task, root / "run.log")
    return root / "run", root / "ckpt"


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chain's directory: its runs' output directories and logs, and the --save directory they share."""
    return tmp_path_factory.mktemp("chain")


@dataclass
class Killed:
    """What a killed run left: its console output, how it ended, and what the test checks of it."""

    output: str
    returncode: int | None
    stopped: float = 0.0  # seconds from the kill to the run's exit
    named: str = ""  # the start of the error that names the killed rank, its node and process


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def kill_rank_1(out: Path, proc: subprocess.Popen[bytes], log: Path, release: Path | None = None) -> Killed:
    """SIGKILL trainer rank 1 (its pid from the run's placement.json) and wait (2 minutes at most) for the run to
    stop; with `release`, touch it once rank 0 is gone too (the driver kills the live ranks when it stops for a
    lost one: the error is raised by then)."""
    ranks = json.loads((out / "placement.json").read_text())["trainer"]
    victim = ranks[1]
    os.kill(victim["pid"], signal.SIGKILL)
    killed = time.monotonic()
    if release is not None:
        while not gone(ranks[0]["pid"]) and proc.poll() is None and time.monotonic() < killed + 120:
            time.sleep(0.1)
        release.touch()
    proc.wait(timeout=max(1.0, killed + 120 - time.monotonic()))
    stopped = time.monotonic() - killed
    print(f"stopped {stopped:.1f} s after the kill")
    node = f"{victim['address']}/{victim['node'][:8]}"
    named = f"TrainerRankLostError: trainer rank 1 (node {node}, pid {victim['pid']})"
    return Killed(log.read_text(), proc.returncode, stopped, named)


@pytest.fixture(scope="module")
def killed_saving(tiny_qwen3: Path, task: Path, chain: Path) -> dict:
    """Run 1: the whole job (its driver) SIGKILLed inside the save of iter_0000003 (after rollout 3). What was left:
    the processes that outlived their driver, the cut-off save and the tracker."""
    out, save, log = chain / "killed-saving", chain / "ckpt", chain / "killed-saving.log"
    cut_off = layout.temporary_dir(save, 3)
    proc = start(job(tiny_qwen3, task, out, save), task, log)
    job_processes: list[psutil.Process] = []
    try:
        wait_for("the first step", lambda: (out / "metrics.jsonl").exists(), proc, log, 0.5)
        job_processes = psutil.Process(proc.pid).children(recursive=True)  # Ray, its workers, SGLang, the router
        wait_for("the save of iter_0000003", cut_off.exists, proc, log, 0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        placed = json.loads((out / "placement.json").read_text())
        pids = [r["pid"] for r in placed["trainer"]] + placed["engines"][0]["pids"] + [placed["router"]["pid"]]
        watched = [p for p in job_processes if p.pid in pids]
        _, alive = psutil.wait_procs(watched, timeout=30)
    finally:
        proc.kill()
        # What the test watched is settled; Ray's own processes may linger for many seconds: sweep them now.
        for leftover in psutil.wait_procs(job_processes, timeout=1)[1]:
            with contextlib.suppress(psutil.NoSuchProcess):
                leftover.kill()
    return {
        "pids": pids,
        "watched": watched,
        "outlived": alive,
        "cut_off": cut_off.exists(),
        "complete": (save / "iter_0000003").exists(),
        "tracker": layout.read_tracker(save),
    }


@pytest.fixture(scope="module")
def killed_held(killed_saving: dict, tiny_qwen3: Path, task: Path, chain: Path) -> Killed:
    """Run 2, resumed from Run 1's checkpoint: rank 1 killed while the ranks wait out a long rollout 2."""
    out, save, log = chain / "killed-held", chain / "ckpt", chain / "killed-held.log"
    held, released = task / "held", task / "released"
    held.unlink(missing_ok=True)
    released.unlink(missing_ok=True)
    hold = ("--custom-generate-function-path", "hold_generate.generate")
    proc = start(job(tiny_qwen3, task, out, save, "--load", str(save), *hold), task, log)
    try:
        wait_for("rollout 2 to be held", held.exists, proc, log, 0.2)
        return kill_rank_1(out, proc, log, released)
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def killed_training(killed_held: Killed, tiny_qwen3: Path, task: Path, chain: Path) -> Killed:
    """Run 3, resumed from the same checkpoint, named as its iteration directory this time (the others name the
    --save directory, whose tracker names it): rank 1 killed while the ranks train rollout 2."""
    out, save, log = chain / "killed-training", chain / "ckpt", chain / "killed-training.log"
    proc = start(job(tiny_qwen3, task, out, save, "--load", str(save / "iter_0000001")), task, log)
    try:
        # Rollout 2 generated (resumed at rollout 2): the ranks are training it now.
        wait_for("rollout 2", lambda: (out / "rollouts" / "rollout_000002.jsonl").exists(), proc, log, 0.05)
        return kill_rank_1(out, proc, log)
    finally:
        proc.kill()


def resumed_from_the_first_checkpoint(output: str, save: Path) -> bool:
    return f"resumed from {save / 'iter_0000001'} at rollout 2" in output


def assert_stopped_naming(killed: Killed, save: Path) -> None:
    """The run failed within 60 s of the kill, with an error naming the rank, its node and process, and the
    checkpoint to resume from."""
    assert killed.returncode != 0 and killed.stopped < 60, killed.output[-6000:]
    assert killed.named in killed.output, killed.output[-6000:]
    resume = f"The last complete checkpoint is {save / 'iter_0000001'}: resume with --load {save}."
    assert resume in killed.output, killed.output[-6000:]


def test_a_job_killed_while_saving_leaves_the_checkpoint_before(killed_saving: dict) -> None:
    # The processes that hold devices and ports died with their driver (PDEATHSIG, Ray's fate sharing).
    assert len(killed_saving["watched"]) == len(killed_saving["pids"]), killed_saving
    assert killed_saving["outlived"] == [], f"outlived their driver: {killed_saving['outlived']}"
    # Cut off inside the save: the tracker names the checkpoint before (the last run of the chain resumes from it).
    assert killed_saving["cut_off"] and not killed_saving["complete"]
    assert killed_saving["tracker"] == 1


def test_a_trainer_rank_killed_during_a_long_rollout_stops_the_run_before_the_rollout_ends(
    killed_held: Killed, chain: Path
) -> None:
    save = chain / "ckpt"
    assert resumed_from_the_first_checkpoint(killed_held.output, save), killed_held.output[-6000:]
    assert_stopped_naming(killed_held, save)
    # Noticed while the driver waited for the rollout (not at the next trainer call, minutes later).
    assert killed_held.named + " died while rollout 2 generated" in killed_held.output, killed_held.output[-6000:]


def test_a_trainer_rank_killed_while_training_stops_the_run_with_one_error(
    killed_training: Killed, chain: Path
) -> None:
    save = chain / "ckpt"
    assert resumed_from_the_first_checkpoint(killed_training.output, save), killed_training.output[-6000:]
    assert_stopped_naming(killed_training, save)
    output = killed_training.output
    assert "Traceback" in output and output.count("TrainerRankLostError:") == 1, output[-6000:]


def rollouts(out: Path) -> dict[int, list[dict]]:
    """The samples of every rollout a run dumped, by rollout id."""
    return {
        int(f.stem.split("_")[1]): [json.loads(line) for line in f.read_text().splitlines()]
        for f in sorted((out / "rollouts").glob("rollout_*.jsonl"))
    }


def eval_responses(out: Path, step: int) -> list[tuple[str, str]]:
    rows = [json.loads(line) for line in (out / "rollouts" / f"eval_{step:06d}.jsonl").read_text().splitlines()]
    return [(r["prompt"], r["response"]) for r in rows]


def test_resumed_after_the_faults_the_run_ends_where_the_uninterrupted_run_ends(
    killed_training: Killed, reference: tuple[Path, Path], tiny_qwen3: Path, task: Path, chain: Path
) -> None:
    """After the job killed mid-save and the two killed ranks: resumed at rollout 2, in the other placement
    (disaggregated: the checkpoint does not depend on it), the run logged rollouts 2 and 3 and the final evaluation
    as the reference run did, trained on the same samples, evaluated to the same answers and saved the same weights;
    its save of iter_0000003 replaced the cut-off one."""
    resumed, save = chain / "resumed", chain / "ckpt"
    cut_off = layout.temporary_dir(save, 3)
    cmd = job(tiny_qwen3, task, resumed, save, "--load", str(save), colocate=False)
    output = run(cmd, task, chain / "resumed.log")
    assert resumed_from_the_first_checkpoint(output, save), output[-6000:]
    assert not cut_off.exists() and layout.read_tracker(save) == 3
    ref_out, ref_save = reference
    got, want = rollouts(resumed), rollouts(ref_out)
    assert sorted(got) == [2, 3]  # rollouts 2 and 3 only
    key = [[(s["prompt"], s["index"], s["group_index"]) for s in want[i]] for i in (2, 3)]
    assert [[(s["prompt"], s["index"], s["group_index"]) for s in got[i]] for i in (2, 3)] == key
    assert {s["weight_version"] for s in got[2]} == {2}  # the servers resumed at the checkpoint's weight version
    assert_same_metrics(resumed, ref_out, [2, 3, NUM_ROLLOUT])
    assert_same_samples(resumed, ref_out, [2, 3])
    assert eval_responses(resumed, NUM_ROLLOUT) == eval_responses(ref_out, NUM_ROLLOUT)
    assert_same_weights(save / "iter_0000003", ref_save / "iter_0000003")
