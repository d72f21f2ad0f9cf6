"""The VLM demo's loop as a user starts it (scripts/run-tiny-vlm-cpu.sh, shortened): `python -m slime_like.train` with
--multimodal-keys on the tiny Qwen2.5-VL and pictures drawn by tools/make_vlm_demo_data.py (parquet in slime's geo3k
columns), through Ray placement, SGLang's CPU engine behind the router, the Megatron trainer with the vision tower,
and the in-place weight update checked against the server (--check-weight-update, whose probe holds an image).

Two rollouts: each trains one step and updates the server's weights; a greedy eval runs before the first and after
the last. Checked: every sample carries its picture and the processor's tensors, the trainer's log-probs of the
sampled tokens equal SGLang's (fp32), the first step's ratio is exactly 1 (the old-policy forward saw the images),
the weight check passed (the run would have stopped), and the curves PNG is written. Rollouts are greedy (top-k 1),
as in test_train_loop.py; a reward from the answer's ids gives every step a gradient on a random model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tools.make_vlm_demo_data import make_vlm_demo_data

REWARD_PLUGIN = """
def reward(args, sample):
    return float(sum(sample.tokens[len(sample.tokens) - sample.response_length:]) % 3)
"""


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vlm-demo")
    make_vlm_demo_data(root, n_train=4, n_eval=2, n_sft=0, seed=1)
    (root / "answer_ids_rm.py").write_text(REWARD_PLUGIN)
    return root


def test_vlm_loop_rolls_out_trains_and_updates_weights(tiny_qwen2_5_vl: Path, task: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "slime_like.train", "--num-rollout", "2",
        "--hf-checkpoint", str(tiny_qwen2_5_vl), "--prompt-data", str(task / "train.parquet"),
        "--input-key", "problem", "--label-key", "answer", "--apply-chat-template",
        "--multimodal-keys", '{"image": "images"}', "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
        "--rollout-max-response-len", "3", "--rollout-top-k", "1", "--custom-rm-path", "answer_ids_rm.reward",
        "--eval-prompt-data", str(task / "eval.parquet"), "--eval-interval", "2", "--eval-temperature", "0",
        "--advantage-estimator", "reinforce_plus_plus", "--lr", "1e-3", "--check-weight-update",
        "--output-dir", str(out), "--save-debug-rollout-data", "--ray-num-cpus", "4",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{task}:{REPO_ROOT}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "train/loss" in r]
    assert len(train) == 2
    assert train[0]["train/ppo_ratio_abs_dev"] == 0.0
    assert all(r["train/train_rollout_logprob_abs_diff"] < 1e-4 for r in train)
    assert [r["step"] for r in records if "eval/reward_mean" in r] == [0, 2]
    for rollout_id in (0, 1):
        samples = [json.loads(line) for line in (out / "rollouts" / f"rollout_{rollout_id:06d}.jsonl").open()]
        assert len(samples) == 4
        for sample in samples:
            assert len(sample["multimodal_inputs"]["images"]) == 1
            assert {"pixel_values", "image_grid_thw"} <= set(sample["multimodal_train_inputs"])
            assert sample["weight_version"] == rollout_id and sample["response_length"] > 0
    assert (out / "curves.png").stat().st_size > 0
