"""Strands Agents (`strands-agents`) trained unchanged: plugins/strands_agent_example.py in a real rollout on the
session's SGLang server (Strands' OpenAI provider streaming, a tool call parsed by SGLang's qwen25 parser, Strands
running the Python tool and sending its result back, the final answer); the trained ids are the sampled ids, and
the samples take a Megatron train step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from buffer.train_data import build_train_data
from rollout.sglang_server import SGLangServer
from slime_like.core.sample import Status
from tests.integration.test_openai_agents_sdk import example_rollout, with_tools_template  # noqa: F401  (a fixture)

N = 2


@pytest.fixture(scope="module")
def rollout_run(with_tools_template: Path, sglang_server: SGLangServer, tmp_path_factory: pytest.TempPathFactory):  # noqa: F811
    """One rollout of N Strands agents; every /generate the endpoint sent, with its answer."""
    root = tmp_path_factory.mktemp("strands")
    return example_rollout(with_tools_template, root, "strands_agent_example", "triple 2", N, sglang_server.url)


def test_strands_calls_its_tool_and_trains_on_the_sampled_ids(rollout_run, with_tools_template: Path) -> None:  # noqa: F811
    from transformers import AutoTokenizer

    group, metrics, sent = rollout_run
    tokenizer = AutoTokenizer.from_pretrained(with_tools_template)
    assert len(group) == N and metrics["rollout/openai_tool_calls"] == N and metrics["rollout/openai_turns"] == 2 * N
    for sample in group:
        assert sample.status == Status.COMPLETED and sample.metadata["openai_turns"] == 2, sample.metadata
        (result,) = sample.metadata["tool_results"]
        response = sample.tokens[sample.prompt_length :]
        model = tokenizer.decode([t for t, m in zip(response, sample.loss_mask, strict=True) if m])
        context = tokenizer.decode([t for t, m in zip(response, sample.loss_mask, strict=True) if not m])
        digit = json.loads(model.split("<tool_call>\n")[1].split("\n</tool_call>")[0])["arguments"]["digit"]
        assert result == str(3 * digit)  # Strands ran our Python tool on the model's arguments
        assert f"<tool_response>\n{result}\n</tool_response>" in context  # ... and sent its result back
        assert model.endswith(sample.metadata["agent_answer"] + "<|im_end|>")  # the answer Strands returned
        assert sample.reward == float(sample.metadata["agent_answer"] == result)
        # Trained ids == sampled ids: the model-masked tokens are, in order, exactly what SGLang sampled.
        turns = sorted((r for r in sent if r["rid"].startswith(f"openai-{sample.index}-")), key=lambda r: len(r["input_ids"]))  # fmt: skip
        sampled = [int(t[1]) for turn in turns for t in turn["out"]["meta_info"]["output_token_logprobs"]]
        assert [t for t, m in zip(response, sample.loss_mask, strict=True) if m] == sampled
        assert sample.tokens[: len(turns[1]["input_ids"])] == turns[1]["input_ids"]  # turn 2 sent the history's ids

    data = build_train_data([group])
    assert [list(t) for t in data.tokens] == [s.tokens for s in group]
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.optimizer import OptimizerSettings
    from slime_like.trainer.megatron.parallel import init_parallel

    init_parallel(tp=1, pp=1, seed=1234)
    engine = MegatronTrainEngine(with_tools_template, OptimizerSettings(lr=1e-3), max_tokens_per_micro_batch=512)

    def loss(per_sequence, rows):  # rows: (response length, loss mask) of this micro-batch's sequences
        terms = [-(lp[-n:] * torch.tensor(mask)).sum() for lp, (n, mask) in zip(per_sequence, rows, strict=True)]
        return sum(terms) / sum(map(sum, data.loss_masks))

    before = engine.forward_logprobs(data.tokens)
    for lp, n, sampled, mask in zip(
        before, data.response_lengths, data.rollout_log_probs, data.loss_masks, strict=True
    ):
        model = torch.tensor(mask, dtype=torch.bool)  # grammar-constrained sampling only removes choices
        assert (torch.tensor(sampled)[model] >= lp[-n:][model] - 1e-4).all()
    out = engine.train_step(data.tokens, list(zip(data.response_lengths, data.loss_masks, strict=True)), loss)
    after = engine.forward_logprobs(data.tokens)
    assert torch.isfinite(torch.tensor(out["loss"]))
    assert (torch.cat(after) - torch.cat(before)).abs().max() > 1e-4
