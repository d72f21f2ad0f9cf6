"""Reward models served in the run (--sglang-config): beside the tiny policy, a generative judge group (a causal LM)
and a classifier reward-model group (a LlamaForSequenceClassification served with SGLang's --is-embedding) score every
sample through plugins/reward_models.py; each reward equals a transformers forward of the same checkpoint.

The run is slime's --debug-rollout-only with slime's dump files, and also the test of that flag (a run's start-up is
most of its cost: one run for both)."""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.conftest import REPO_ROOT

BATCH, N = 2, 2
ROLLOUTS = 2
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


@functools.cache
def loaded(model_dir: Path, kind: str) -> tuple:
    """The tokenizer and the transformers model (`kind`: causal or classifier) of a checkpoint, loaded once."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    auto = AutoModelForCausalLM if kind == "causal" else AutoModelForSequenceClassification
    return AutoTokenizer.from_pretrained(model_dir), auto.from_pretrained(model_dir, dtype=torch.float32)


def expected_judge(model_dir: Path, sample: dict) -> float:
    """P(Yes) / (P(Yes) + P(No)) by a transformers forward of the judge after the default verdict prompt."""
    from plugins.reward_models import JUDGE_PROMPT

    tok, model = loaded(model_dir, "causal")
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
    tok, model = loaded(model_dir, "classifier")
    chat = [{"role": "user", "content": sample["prompt"]}, {"role": "assistant", "content": sample["response"]}]
    ids = list(tok.apply_chat_template(chat, tokenize=True)["input_ids"])
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, 0].item()


@pytest.fixture(scope="module")
def served_run(tiny_qwen3: Path, tiny_qwen2_untied: Path, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """Two rollouts of the policy beside the judge and classifier groups, with --debug-rollout-only and slime's dump
    files (--save-debug-rollout-data with a {rollout_id} path); the run's directories, records and dumps."""
    tmp_path = tmp_path_factory.mktemp("served")
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
    out, dump = tmp_path / "run", tmp_path / "dump"
    cmd = [
        sys.executable, "-m", "slime_like.train", "--hf-checkpoint", str(tiny_qwen3),
        "--prompt-data", str(tmp_path / "train.jsonl"), "--input-key", "prompt", "--label-key", "label",
        "--rollout-batch-size", str(BATCH), "--n-samples-per-prompt", str(N), "--num-rollout", str(ROLLOUTS),
        "--rollout-max-response-len", "8", "--debug-rollout-only",
        "--save-debug-rollout-data", str(dump / "{rollout_id}.pt"),
        "--sglang-config", str(config), "--rollout-num-gpus", "3",
        "--custom-rm-path", "both_rewards.both", "--reward-key", "judge",
        "--output-dir", str(out), "--ray-num-cpus", "4",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{tmp_path}", "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    run = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    dumped = [torch.load(dump / f"{i}.pt", weights_only=False) for i in range(ROLLOUTS)]
    return SimpleNamespace(out=out, classifier=classifier, records=records, dumped=dumped)


def test_a_judge_group_and_a_classifier_group_score_the_rollout(
    served_run: SimpleNamespace, tiny_qwen2_untied: Path
) -> None:
    samples = served_run.dumped[0]["samples"]
    classifier = served_run.classifier
    assert len(samples) == BATCH * N and all(s["status"] != "failed" for s in samples), samples
    judged = [(s["reward"]["judge"], expected_judge(tiny_qwen2_untied, s)) for s in samples]
    scored = [(s["reward"]["rm"], expected_score(classifier, s)) for s in samples]
    print("judge rewards (served, transformers):", judged, "classifier scores:", scored)
    for served, expected in judged + scored:
        assert served == pytest.approx(expected, abs=1e-4)
    assert len({round(s["reward"]["rm"], 6) for s in samples}) > 1  # the scores depend on the response


def test_debug_rollout_only_generates_without_a_trainer(served_run: SimpleNamespace) -> None:
    """slime's --debug-rollout-only: no trainer rank starts; rollouts are generated and saved in slime's format."""
    out = served_run.out
    assert json.loads((out / "placement.json").read_text())["trainer"] == []
    assert not list((out / "logs").glob("trainer_rank*"))
    assert [r["step"] for r in served_run.records] == [0, 1] and not any("train/loss" in r for r in served_run.records)
    assert [d["rollout_id"] for d in served_run.dumped] == [0, 1]
    assert [len(d["samples"]) for d in served_run.dumped] == [BATCH * N] * 2
    # No trainer, no weight update: both rollouts ran on the servers' first weights.
    assert {s["weight_version"] for d in served_run.dumped for s in d["samples"]} == {0}
