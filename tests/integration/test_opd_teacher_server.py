"""On-policy distillation as slime runs it (--use-opd --opd-type sglang): a teacher SGLang server scores every sampled
token through slime's own reward function and post-process, and the student trains on the teacher's reverse KL.
It runs in the one-step async loop (slime_like.train_async); the sync loop's OPD run, with the teacher served as a
--sglang-config group, is tests/integration/test_model_groups_served.py.

Whether the KL falls is not asserted: between two tiny random models it is ~0.05 nats and moves more with the
sampled batch than with a few steps (measured over 6 steps: 0.049, 0.019, 0.035, 0.042, 0.061, 0.001)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout import sglang_client as client
from rollout.sglang_server import SGLangServer
from tests.integration.test_train_loop import run_command

OPD = "slime.rollout.on_policy_distillation"


@pytest.fixture(scope="module")
def teacher(tiny_qwen2_untied: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangServer]:
    """Another model with the student's tokenizer, served outside the run (no run secret), as slime's examples do."""
    with SGLangServer(tiny_qwen2_untied, dtype="float32", api_key="", log_dir=tmp_path_factory.mktemp("t")) as server:
        yield server


def test_the_student_trains_on_the_teacher_s_log_probs(teacher: SGLangServer, tiny_qwen3: Path, tmp_path: Path) -> None:
    rows = [{"prompt": f"{a}+{a}=", "label": str(2 * a)} for a in range(8)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "slime_like.train_async", "--hf-checkpoint", str(tiny_qwen3),
        "--prompt-data", str(tmp_path / "train.jsonl"), "--input-key", "prompt", "--label-key", "label",
        "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--num-rollout", "2",
        "--rollout-max-response-len", "8", "--rollout-temperature", "1.0", "--lr", "1e-2",
        "--use-opd", "--opd-type", "sglang", "--rm-url", f"{teacher.url}/generate",
        "--custom-rm-path", f"{OPD}.reward_func", "--custom-reward-post-process-path", f"{OPD}.post_process_rewards",
        "--output-dir", str(out), "--save-debug-rollout-data", "--ray-num-cpus", "4",
    ]  # fmt: skip
    proc = run_command(cmd, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    kl = [r["train/opd_reverse_kl"] for r in records if "train/opd_reverse_kl" in r]
    assert len(kl) == 2
    # The teacher's log-probs on each sample are the teacher server's own, for exactly the response tokens.
    samples = [json.loads(line) for line in (out / "rollouts" / "rollout_000000.jsonl").read_text().splitlines()]
    for sample in samples[:3]:
        n = sample["response_length"]
        scored = client.prompt_logprobs(teacher.url, sample["tokens"])[-n:]
        assert sample["teacher_log_probs"] == pytest.approx(scored, abs=1e-5)
        assert sample["reward"] == 0.0  # slime's pure distillation: the signal is the KL term alone
    # Pure distillation: the rewards are 0, so every token's advantage is minus its reverse KL to the teacher, and on
    # the first step (ratio 1) the policy loss is the mean reverse KL itself, and the advantage mean its negative.
    # (The per-token estimate log pi_s - log pi_t of sampled tokens averages to the KL only in expectation: one
    # batch's mean can be negative, measured -0.032 once.)
    first = records[0]
    assert first["train/opd_reverse_kl"] != 0
    assert first["train/pg_loss"] == pytest.approx(first["train/opd_reverse_kl"], rel=1e-5)
    assert first["train/advantage_mean"] == pytest.approx(-first["train/opd_reverse_kl"], rel=1e-5)
