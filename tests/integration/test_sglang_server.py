"""A real SGLang server serves the tiny model, and its log-probs match a transformers forward pass."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
import torch

from rollout.sglang_client import flush_cache, freeze_gc, generate
from rollout.sglang_server import CPU_ENV, KEEP_ALIVE_ENV, LAUNCH_FORKED_ON_CPU, SGLangServer
from slime_like.core.secret import API_KEY_ENV

# Both sides run the same fp32 weights; only the kernels' summation order differs (torch_native attention vs
# transformers' sdpa), which moves a log-prob by ~5e-7 here (earlier measurements on other CPUs stayed <= 0.002, also for bf16).
# 1e-3 leaves room for other CPUs and thread counts yet stays far below what a real bug changes: in this random
# model a position's log-probs spread ~0.17 nat over the vocabulary, top-1/top-2 gaps are ~0.1-0.7 nat, and
# shifting the positions by one moves log-probs by ~0.1-0.9 nat.
LOGPROB_TOL = 1e-3


def test_command_uses_cpu_flags_only_on_cpu(tiny_qwen3: Path) -> None:
    cpu_cmd, cpu_env = SGLangServer(tiny_qwen3, port=30123, device="cpu").command()
    assert cpu_cmd[1:4] == ["-c", LAUNCH_FORKED_ON_CPU, "sglang.launch_server"]  # its children start by fork
    assert {"--device", "cpu", "--attention-backend", "torch_native", "--sleep-on-idle"} <= set(cpu_cmd)
    assert cpu_cmd[cpu_cmd.index("--max-total-tokens") + 1] == "65536"
    # Idle connections outlive the router's pool on every device (rollout/sglang_server.py says why).
    assert cpu_env == {**KEEP_ALIVE_ENV, **CPU_ENV, "OMP_NUM_THREADS": "1", API_KEY_ENV: ""}

    gpu_cmd, gpu_env = SGLangServer(tiny_qwen3, port=30123, device="cuda", extra_args=["--tp-size", "2"]).command()
    assert not {"--device", "--attention-backend", "--sleep-on-idle", "--max-total-tokens"} & set(gpu_cmd)
    assert gpu_env == KEEP_ALIVE_ENV and gpu_cmd[-2:] == ["--tp-size", "2"]


def test_server_is_healthy_and_serves_the_model(sglang_server: SGLangServer, tiny_qwen3: Path) -> None:
    assert requests.get(f"{sglang_server.url}/health", timeout=10).status_code == 200
    info = requests.get(f"{sglang_server.url}/model_info", timeout=10).json()
    assert info["model_path"] == str(tiny_qwen3)
    flush_cache(sglang_server.url, attempts=5)  # idle server: answers 200 at once


def test_start_freezes_the_server_gc(sglang_server: SGLangServer) -> None:
    """Ready means GC-frozen: the scheduler no longer walks its start-up heap on every cache flush."""
    assert "Freezing GC in Scheduler process" in sglang_server.log_path.read_text()
    assert freeze_gc(sglang_server.url)  # idempotent: a second freeze is accepted


def test_generate_logprobs_match_transformers(sglang_server: SGLangServer, tiny_qwen3: Path) -> None:
    from transformers import AutoModelForCausalLM

    prompt = [11, 57, 203, 9, 300, 42, 7]
    out = generate(
        sglang_server.url,
        prompt,
        {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True},
        return_logprob=True,
        logprob_start_len=0,
    )
    meta = out["meta_info"]
    # Each entry is [logprob, token_id, text-or-None].
    new_tokens = [tok for _, tok, _ in meta["output_token_logprobs"]]
    served = torch.tensor([lp for lp, _, _ in meta["output_token_logprobs"]], dtype=torch.float64)
    assert len(new_tokens) == 12 and out["output_ids"] == new_tokens

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + new_tokens])).logits[0]
    logprobs = torch.log_softmax(logits.double(), dim=-1)
    # Token t is predicted by the logits at position t - 1.
    positions = torch.arange(len(prompt) - 1, len(prompt) + len(new_tokens) - 1)
    reference = logprobs[positions, torch.tensor(new_tokens)]
    assert (served - reference).abs().max().item() < LOGPROB_TOL

    # Greedy: every generated token is the transformers argmax (up to the tolerance, for near-ties).
    assert (logprobs[positions].max(dim=-1).values - reference).max().item() < LOGPROB_TOL

    # The prompt's log-probs (first token has none) match too.
    served_prompt = torch.tensor([lp for lp, _, _ in meta["input_token_logprobs"][1:]], dtype=torch.float64)
    reference_prompt = logprobs[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
    assert (served_prompt - reference_prompt).abs().max().item() < LOGPROB_TOL


def test_generate_reports_http_errors(sglang_server: SGLangServer) -> None:
    with pytest.raises(RuntimeError, match=r"/generate answered HTTP 4\d\d"):
        generate(sglang_server.url, [1, 2, 3], {"max_new_tokens": -5})
