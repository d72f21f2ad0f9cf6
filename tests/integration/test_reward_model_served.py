"""Reward models served in the run (--sglang-config): beside the tiny policy, a generative judge group (a causal LM)
and a classifier reward-model group (a LlamaForSequenceClassification served with SGLang's --is-embedding) score every
sample through plugins/reward_models.py; each reward equals a transformers forward of the same checkpoint."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO_ROOT

BATCH, N = 2, 2
# One reward function per run: this one returns both scores, the judge's trains (--reward-key judge).
BOTH = """
from plugins.reward_models import classifier_reward, generative_judge

async def both(args, sample):
    return {"judge": await generative_judge(args, sample), "rm": await classifier_reward(args, sample)}
"""


def make_classifier(source: Path, out: Path) -> Path:
    """A tiny LlamaForSequenceClassification (one score) with the source checkpoint's sizes and tokenizer."""
    from transformers import AutoConfig, AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    src = AutoConfig.from_pretrained(source)
    config = LlamaConfig(
        vocab_size=src.vocab_size, hidden_size=src.hidden_size, intermediate_size=src.intermediate_size,
        num_hidden_layers=src.num_hidden_layers, num_attention_heads=src.num_attention_heads,
        num_key_value_heads=src.num_key_value_heads, max_position_embeddings=src.max_position_embeddings,
        id2label={0: "LABEL_0"}, label2id={"LABEL_0": 0}, pad_token_id=src.pad_token_id,
        bos_token_id=src.bos_token_id, eos_token_id=src.eos_token_id, architectures=["LlamaForSequenceClassification"],
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForSequenceClassification(config).float().save_pretrained(out)
    AutoTokenizer.from_pretrained(source).save_pretrained(out)
    return out


def expected_judge(model_dir: Path, sample: dict) -> float:
    """P(Yes) / (P(Yes) + P(No)) by a transformers forward of the judge after the default verdict prompt."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from plugins.reward_models import JUDGE_PROMPT

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    text = JUDGE_PROMPT.format(prompt=sample["prompt"], response=sample["response"], label=sample["label"])
    prompt = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"])
    sums = []
    for word in ("Yes", "No"):
        cont = tok.encode(word, add_special_tokens=False)
        seq = prompt + cont
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([seq])).logits[0].float(), dim=-1)
        sums.append(sum(logp[len(prompt) + i - 1, t].item() for i, t in enumerate(cont)))
    return 1.0 / (1.0 + math.exp(sums[1] - sums[0]))


def expected_score(model_dir: Path, sample: dict) -> float:
    """The classifier's score of the [user: prompt, assistant: response] conversation by a transformers forward."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32)
    chat = [{"role": "user", "content": sample["prompt"]}, {"role": "assistant", "content": sample["response"]}]
    ids = list(tok.apply_chat_template(chat, tokenize=True)["input_ids"])
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, 0].item()


def test_a_judge_group_and_a_classifier_group_score_the_rollout(
    tiny_qwen3: Path, tiny_qwen2_untied: Path, tmp_path: Path
) -> None:
    classifier = make_classifier(tiny_qwen2_untied, tmp_path / "rm")
    rows = [{"prompt": f"What is {a}+{a}?", "label": str(2 * a)} for a in range(BATCH)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "both_rewards.py").write_text(BOTH)
    config = tmp_path / "groups.yaml"
    config.write_text(f"""
sglang:
  - name: actor
    server_groups:
      - {{worker_type: regular, num_gpus: 1}}
  - name: judge
    model_path: {tiny_qwen2_untied}
    server_groups:
      - {{worker_type: regular, num_gpus: 1, overrides: {{dtype: float32}}}}
  - name: reward
    model_path: {classifier}
    server_groups:
      - {{worker_type: regular, num_gpus: 1, overrides: {{dtype: float32, is_embedding: true}}}}
""")
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "slime_like.train", "--hf-checkpoint", str(tiny_qwen3),
        "--prompt-data", str(tmp_path / "train.jsonl"), "--input-key", "prompt", "--label-key", "label",
        "--rollout-batch-size", str(BATCH), "--n-samples-per-prompt", str(N), "--num-rollout", "1",
        "--rollout-max-response-len", "8", "--debug-rollout-only", "--save-debug-rollout-data",
        "--sglang-config", str(config), "--rollout-num-gpus", "3",
        "--custom-rm-path", "both_rewards.both", "--reward-key", "judge",
        "--output-dir", str(out), "--ray-num-cpus", "4",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{tmp_path}", "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    run = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    samples = [json.loads(line) for line in (out / "rollouts" / "rollout_000000.jsonl").read_text().splitlines()]
    assert len(samples) == BATCH * N and all(s["status"] != "failed" for s in samples), samples
    judged = [(s["reward"]["judge"], expected_judge(tiny_qwen2_untied, s)) for s in samples]
    scored = [(s["reward"]["rm"], expected_score(classifier, s)) for s in samples]
    print("judge rewards (served, transformers):", judged, "classifier scores:", scored)
    for served, expected in judged + scored:
        assert served == pytest.approx(expected, abs=1e-4)
    assert len({round(s["reward"]["rm"], 6) for s in samples}) > 1  # the scores depend on the response
