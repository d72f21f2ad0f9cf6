"""End-to-end runs of the real loop (Ray, SGLang, router, Megatron) as a user starts them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO_ROOT
from tests.integration.same_run import timing

N_PROMPTS = 6
N_SAMPLES = 2
BATCH = 2  # prompts per rollout: one epoch is 3 rollouts

# A reward plugin that raises for one label: those samples must be marked failed, the run go on. The others get
# rewards that differ between prompts (a tiny random model never answers right): with greedy rollouts and a
# batch-normalised estimator every step has a loss and a gradient, so a resumed run has something to reproduce.
REWARD_PLUGIN = """
def reward(args, sample):
    if sample.label == "4":
        raise RuntimeError("reward service down")
    return float(sum(sample.tokens) % 3)
"""


# slime's --custom-convert-samples-to-train-data-path, written as slime's built-in conversion for an estimator that
# takes raw rewards (reinforce_plus_plus), minus the samples our build leaves out (failed: no usable reward).
SLIME_CONVERTER = """
from pathlib import Path

def convert(args, samples):
    kept = [s for s in samples if s.status.name not in ("FAILED", "ABORTED") and s.response_length > 0]
    with open(Path(__file__).with_suffix(".calls"), "a") as calls:
        calls.write(f"{len(samples)} {len(kept)}\\n")
    return {
        "tokens": [s.tokens for s in kept],
        "response_lengths": [s.response_length for s in kept],
        "rewards": [s.reward for s in kept],
        "raw_reward": [s.reward for s in kept],
        "truncated": [int(s.status.name == "TRUNCATED") for s in kept],
        "sample_indices": [s.index for s in kept],
        "loss_masks": [s.loss_mask or [1] * s.response_length for s in kept],
        "rollout_log_probs": [s.rollout_log_probs for s in kept],
    }
"""


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six addition prompts and the raising reward plugin."""
    root = tmp_path_factory.mktemp("task")
    rows = [{"prompt": f"{a}+{a}=", "label": str(2 * a)} for a in range(N_PROMPTS)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "raising_rm.py").write_text(REWARD_PLUGIN)
    (root / "down_rm.py").write_text("def reward(args, sample):\n    raise ConnectionError('reward service down')\n")
    (root / "slime_convert.py").write_text(SLIME_CONVERTER)
    return root


def loop_command(module: str, model: Path, task: Path, out: Path, *extra: str, num_rollout: int = 6) -> list[str]:
    """`python -m module` with a small config."""
    return [
        sys.executable, "-m", module,
        "--hf-checkpoint", str(model), "--prompt-data", str(task / "train.jsonl"), "--rollout-shuffle",
        "--input-key", "prompt", "--label-key", "label",
        "--rollout-batch-size", str(BATCH), "--n-samples-per-prompt", str(N_SAMPLES),
        "--num-rollout", str(num_rollout), "--rollout-max-response-len", "3", "--rollout-stop-token-ids", "2",
        # Greedy (top-k 1): sampled rollouts are not replayed on the CPU engine (tests/integration/same_run.py).
        "--rollout-top-k", "1", "--advantage-estimator", "reinforce_plus_plus", "--lr", "1e-3",
        "--output-dir", str(out), "--save-debug-rollout-data", "--ray-num-cpus", "4",
        "--custom-rm-path", "raising_rm.reward", *extra,
    ]  # fmt: skip


def run_command(cmd: list[str], task: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{task}:{REPO_ROOT}", "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)


def run_loop(module: str, model: Path, task: Path, out: Path, *extra: str, num_rollout: int = 6) -> list[dict]:
    """Run `python -m module` with a small config; return its metrics records."""
    proc = run_command(loop_command(module, model, task, out, *extra, num_rollout=num_rollout), task)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def rollouts(out: Path) -> list[list[dict]]:
    """The samples of every rollout, in order."""
    files = sorted((out / "rollouts").glob("rollout_*.jsonl"))
    assert files, f"no rollouts dumped under {out}"
    return [[json.loads(line) for line in f.read_text().splitlines()] for f in files]


def check_epochs(per_rollout: list[list[dict]]) -> None:
    """Every prompt once per epoch, each with N_SAMPLES samples; no sample lost or duplicated."""
    per_epoch = N_PROMPTS // BATCH
    for epoch in range(len(per_rollout) // per_epoch):
        samples = [s for r in per_rollout[epoch * per_epoch : (epoch + 1) * per_epoch] for s in r]
        assert Counter(s["prompt"] for s in samples) == {f"{a}+{a}=": N_SAMPLES for a in range(N_PROMPTS)}
    every = [s for r in per_rollout for s in r]
    assert sorted(s["index"] for s in every) == list(range(len(every)))
    assert all(s["status"] in ("completed", "truncated", "failed") for s in every)


def check_reward_failures(records: list[dict], per_rollout: list[list[dict]]) -> None:
    """Samples whose reward function raised are failed with reward 0 and counted; the run went on."""
    failed = [s for r in per_rollout for s in r if s["label"] == "4"]
    assert failed and all(s["status"] == "failed" and s["reward"] == 0.0 for s in failed)
    assert all("reward service down" in s["metadata"]["reward_error"] for s in failed)
    counted = sum(r.get("rollout/reward_failed", 0) for r in records)
    assert counted == len(failed)


# Saved every 3 rollouts (the layout test_sync_colocated_distributed_update checks), greedy eval every 3. A resume
# that ends where the uninterrupted run ends, in another placement: tests/integration/test_trainer_faults.py.
SYNC_SAVE_ARGS = ("--save-interval", "3", "--eval-interval", "3", "--eval-temperature", "0")


@pytest.fixture(scope="module")
def sync_run(tiny_qwen3: Path, task: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    out = tmp_path_factory.mktemp("sync")
    records = run_loop(
        "slime_like.train", tiny_qwen3, task, out / "run", "--colocate", "--save", str(out / "ckpt"),
        "--eval-prompt-data", str(task / "train.jsonl"), *SYNC_SAVE_ARGS,
    )  # fmt: skip
    return out, records


def test_sync_colocated_distributed_update(sync_run: tuple[Path, list[dict]]) -> None:
    out, records = sync_run
    per_rollout = rollouts(out / "run")
    assert len(per_rollout) == 6
    check_epochs(per_rollout)
    check_reward_failures(records, per_rollout)
    train = [r for r in records if "train/loss" in r]
    assert len(train) == 6
    # First step, before any update: recomputed log-probs equal the old ones, so the ratio is exactly 1.
    assert train[0]["train/ppo_ratio_abs_dev"] == 0.0 and train[0]["train/pg_clipfrac"] == 0.0
    # SGLang and Megatron agree on the rollout tokens, before and after weight updates: both run in fp32
    # (SGLang's own default would serve this fp32 checkpoint in fp16, ~1e-3 apart).
    assert all(r["train/train_rollout_logprob_abs_diff"] < 1e-4 for r in train)
    # Samples carry the weight version that produced them: rollout k ran on version k (synchronous).
    assert [{s["weight_version"] for s in r} for r in per_rollout] == [{k} for k in range(6)]
    assert (out / "run" / "curves.png").stat().st_size > 0
    # Megatron-LM's layout, as slime saves it: iter_<rollout id>/ and the tracker naming the last one.
    ckpt = out / "ckpt"
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "iter_0000002",
        "iter_0000005",
        "latest_checkpointed_iteration.txt",
    ]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "5"
    assert {"metadata.json", "common.pt", "slime_like_state.json", "slime_like_complete"} <= {
        p.name for p in (ckpt / "iter_0000002").iterdir()
    }


def test_a_saved_rollout_replays_into_training_bit_identically(
    sync_run: tuple[Path, list[dict]], tiny_qwen3: Path, task: Path, tmp_path: Path
) -> None:
    """slime's --load-debug-rollout-data: no server starts, and training on the sync run's saved rollouts takes the
    same steps (every train metric equal), from the same weights."""
    out, records = sync_run
    template = str(out / "run" / "rollouts" / "rollout_{rollout_id:06d}.jsonl")
    replay = run_loop(
        "slime_like.train", tiny_qwen3, task, tmp_path / "replay", "--load-debug-rollout-data", template,
        "--save-debug-train-data", str(tmp_path / "train" / "{rollout_id}.pt"), num_rollout=3,
    )  # fmt: skip
    placement = json.loads((tmp_path / "replay" / "placement.json").read_text())
    assert placement["engines"] == [] and placement["router"]["url"] is None
    assert not list((tmp_path / "replay" / "logs").glob("sglang*"))
    original = {r["step"]: r for r in records if "train/loss" in r}
    replayed = {r["step"]: r for r in replay if "train/loss" in r}
    assert sorted(replayed) == [0, 1, 2]
    for step, metrics in replayed.items():
        train = {k: v for k, v in metrics.items() if k.startswith("train/") and not timing(k)}
        assert train and train == {k: original[step][k] for k in train}, step
    saved = torch.load(tmp_path / "train" / "1.pt")
    assert saved["tokens"] == [s["tokens"] for s in rollouts(out / "run")[1] if s["status"] != "failed"]


def test_a_slime_sample_converter_trains_as_the_built_in_conversion(
    sync_run: tuple[Path, list[dict]], tiny_qwen3: Path, task: Path, tmp_path: Path
) -> None:
    """slime's --custom-convert-samples-to-train-data-path: replaying the sync run's rollouts through a converter
    that builds slime's train-data dict takes the same training steps as the built-in conversion did."""
    out, records = sync_run
    template = str(out / "run" / "rollouts" / "rollout_{rollout_id:06d}.jsonl")
    replay = run_loop(
        "slime_like.train", tiny_qwen3, task, tmp_path / "replay", "--load-debug-rollout-data", template,
        "--custom-convert-samples-to-train-data-path", "slime_convert.convert", num_rollout=3,
    )  # fmt: skip
    calls = (task / "slime_convert.calls").read_text().split("\n")[:-1]
    assert len(calls) == 3 and all(c.split()[0] == str(BATCH * N_SAMPLES) for c in calls)
    original = {r["step"]: r for r in records if "train/loss" in r}
    replayed = {r["step"]: r for r in replay if "train/loss" in r}
    assert sorted(replayed) == [0, 1, 2]
    for step, metrics in replayed.items():
        train = {k: v for k, v in metrics.items() if k.startswith("train/") and not timing(k)}
        assert train and train == pytest.approx({k: original[step][k] for k in train}, rel=1e-6, abs=1e-9), step


def test_a_rollout_whose_every_sample_failed_stops_the_run(tiny_qwen3: Path, task: Path, tmp_path: Path) -> None:
    """Not step after step of training on nothing: the first such rollout stops the run, quoting the error."""
    cmd = loop_command("slime_like.train", tiny_qwen3, task, tmp_path / "run", num_rollout=3)
    proc = run_command([*cmd, "--custom-rm-path", "down_rm.reward"], task)  # the last --custom-rm-path wins
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    assert "RolloutFailedError: rollout 0: all 4 samples failed (2 groups by reward)" in output, output[-5000:]
    assert "ConnectionError('reward service down')" in output and "--custom-rm-path" in output
    assert (
        not (tmp_path / "run" / "metrics.jsonl").exists()
        or "train/loss" not in (tmp_path / "run" / "metrics.jsonl").read_text()
    )
