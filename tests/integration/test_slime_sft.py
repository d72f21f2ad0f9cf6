"""slime's SFT script shape runs unchanged: slime.rollout.sft_rollout with --loss-mask-type, --debug-train-only
(no SGLang server), --disable-compute-advantages-and-returns, --calculate-per-token-loss, train_async.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from transformers import AutoTokenizer

from tests.integration.test_train_loop import run_command

ROWS = 8


def test_slime_sft_script_trains_the_assistant_turns(tiny_qwen3: Path, tmp_path: Path) -> None:
    rows = []
    for a in range(ROWS):
        chat = [
            {"role": "system", "content": "You add."},
            {"role": "user", "content": f"{a}+{a}="},
            {"role": "assistant", "content": str(2 * a)},
            {"role": "user", "content": "and doubled?"},
            {"role": "assistant", "content": str(4 * a)},
        ]
        rows.append({"messages": chat, "tools": json.dumps([{"type": "function", "function": {"name": "add"}}])})
    (tmp_path / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "slime_like.train_async", "--hf-checkpoint", str(tiny_qwen3),
        "--rollout-function-path", "slime.rollout.sft_rollout.generate_rollout", "--loss-mask-type", "qwen",
        "--prompt-data", str(tmp_path / "sft.jsonl"), "--input-key", "messages", "--tool-key", "tools",
        "--rollout-shuffle", "--num-epoch", "3", "--rollout-batch-size", "4", "--global-batch-size", "4",
        "--loss-type", "sft_loss", "--calculate-per-token-loss", "--disable-compute-advantages-and-returns",
        "--debug-train-only", "--lr", "2e-3", "--output-dir", str(out), "--save-debug-rollout-data",
        "--ray-num-cpus", "4",
    ]  # fmt: skip
    proc = run_command(cmd, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "off-policy correction" not in proc.stderr  # SFT has no policy to be off
    losses = [r["train/loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())]
    assert len(losses) == 3 * ROWS // 4  # --num-epoch 3 over 8 rows, 4 a step
    assert sum(losses[-2:]) < sum(losses[:2]) * 0.9, losses
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3)
    for line in (out / "rollouts" / "rollout_000000.jsonl").read_text().splitlines():
        sample = json.loads(line)
        a = int(sample["prompt"][1]["content"].split("+")[0])
        assert sample["metadata"]["tools"][0]["function"]["name"] == "add"
        response = sample["tokens"][-sample["response_length"] :]
        trained = [t for t, m in zip(response, sample["loss_mask"], strict=True) if m]
        # The assistant turns, each through its <|im_end|>\n; the user turn between them is context.
        assert tokenizer.decode(trained) == f"{2 * a}<|im_end|>\n{4 * a}<|im_end|>\n"
        assert tokenizer.decode(response).startswith(f"{2 * a}<|im_end|>\n<|im_start|>user\nand doubled?")
