"""--sglang-config in a real run: the tiny policy and a teacher (another tiny model, same tokenizer) served as two model
groups, each with its own engines and router, placed by Ray. The teacher scores every sampled token through slime's
on-policy-distillation reward (its --rm-url is the teacher group's router); a teacher engine killed mid-run is
restarted by the fault-tolerance monitor, and so is one killed inside a policy weight update (paused: a hook,
tests/integration/update_fault_hook.py); the policy's weight updates never reach the teacher."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from slime_like.trainer.weights.base import HOOK_ENV
from tests.conftest import REPO_ROOT
from tests.integration.test_fault_tolerance import steps_done, wait_for

OPD = "slime.rollout.on_policy_distillation"
ROLLOUTS, BATCH, N = 4, 4, 4


def teacher_log_probs(model_dir: Path, tokens: list[int], n: int) -> list[float]:
    """The teacher checkpoint's own log-probs of the last `n` tokens, by a transformers forward (independent of SGLang)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].float()
    scores = torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(tokens[1:])[:, None])[:, 0]
    return scores[-n:].tolist()


def test_a_teacher_group_scores_restarts_and_keeps_its_weights(
    tiny_qwen3: Path, tiny_qwen2_untied: Path, tmp_path: Path
) -> None:
    rows = [{"prompt": f"{a}+{a}=", "label": str(2 * a)} for a in range(8)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "groups.yaml"
    config.write_text(f"""
sglang:
  - name: actor
    server_groups:
      - {{worker_type: regular, num_gpus: 1}}
  - name: teacher
    model_path: {tiny_qwen2_untied}
    update_weights: false
    server_groups:
      - {{worker_type: regular, num_gpus: 1, overrides: {{dtype: float32}}}}
""")
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "slime_like.train", "--hf-checkpoint", str(tiny_qwen3),
        "--prompt-data", str(tmp_path / "train.jsonl"), "--input-key", "prompt", "--label-key", "label",
        "--rollout-batch-size", str(BATCH), "--n-samples-per-prompt", str(N), "--num-rollout", str(ROLLOUTS),
        "--rollout-max-response-len", "8", "--rollout-temperature", "1.0", "--lr", "1e-2",
        "--sglang-config", str(config), "--rollout-num-gpus", "2",
        "--use-opd", "--opd-type", "sglang",  # no --rm-url: the teacher group's router
        "--custom-rm-path", f"{OPD}.reward_func", "--custom-reward-post-process-path", f"{OPD}.post_process_rewards",
        "--use-fault-tolerance", "--rollout-health-check-interval", "1", "--rollout-health-check-timeout", "5",
        "--check-weight-update", "--save-debug-rollout-data", "--output-dir", str(out), "--ray-num-cpus", "4",
    ]  # fmt: skip
    env = {
        **os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", "UPDATE_FAULT_DIR": str(out),
        HOOK_ENV: "tests.integration.update_fault_hook.kill_at", "UPDATE_FAULT_KILLS": "3:paused:teacher",
    }  # fmt: skip
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for("the first step", lambda: steps_done(out) >= 1, proc)
        placement = json.loads((out / "placement.json").read_text())
        groups = placement["model_groups"]
        assert groups["actor"]["update_weights"] and not groups["teacher"]["update_weights"]
        assert groups["actor"]["router"] != groups["teacher"]["router"]
        assert [e["url"] for e in placement["engines"]] == [e["url"] for e in groups["actor"]["engines"]]
        os.kill(groups["teacher"]["engines"][0]["pids"][0], signal.SIGKILL)
        output, _ = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, output[-6000:]
    assert "model group 'teacher': engine 0" in output and "failed its health check" in output, output[-6000:]
    assert "model group 'teacher': restarted engine 0" in output, output[-6000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "train/loss" in r]
    assert len(train) == ROLLOUTS
    assert all(r["rollout/groups_failed"] == 0 and r["train/opd_reverse_kl"] != 0 for r in train)
    # Killed mid-run, then inside the policy's update to version 3: restarted each time with its own checkpoint.
    assert (out / "kill-3-paused-teacher.json").exists()
    assert output.count("model group 'teacher': restarted engine 0") == 2, output[-6000:]
    assert max(r.get("rollout/teacher/engines_restarted", 0) for r in records) == 2
    assert max(r.get("rollout/engines_restarted", 0) for r in records) == 0  # the policy's engine never died
    # The policy's engine took every update (the check compares it with the trainer: before rollout 0, then each).
    assert output.count("servers match the trainer") >= ROLLOUTS, output[-6000:]
    # After 3 policy updates and a restart, the teacher still serves its own checkpoint: its log-probs of the last
    # rollout's samples are the teacher model's (a transformers forward), not the student's (the rollout's own).
    last = out / "rollouts" / f"rollout_{ROLLOUTS - 1:06d}.jsonl"
    samples = [json.loads(line) for line in last.read_text().splitlines()][:4]
    for sample in samples:
        n = sample["response_length"]
        expected = teacher_log_probs(tiny_qwen2_untied, sample["tokens"], n)
        assert sample["teacher_log_probs"] == pytest.approx(expected, abs=1e-4)  # both fp32
        assert (
            max(abs(a - b) for a, b in zip(sample["teacher_log_probs"], sample["rollout_log_probs"], strict=True))
            > 0.05
        )
