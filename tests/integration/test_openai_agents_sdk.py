"""OpenAI's Agents SDK (`openai-agents`) trained unchanged: plugins/openai_agents_example.py in a real rollout on the
session's SGLang server (a tool call parsed by SGLang's qwen25 parser, the SDK running the Python tool and sending
its result back, the final answer), then the samples in a Megatron forward and train step."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from buffer.train_data import build_train_data
from rollout.sglang_server import SGLangServer
from slime_like.core.sample import Status
from tests.integration.recorded_rollout import agent_args, recorded_rollout
from tests.integration.test_openai_endpoint import TOOLS_TEMPLATE

N = 4


@pytest.fixture(scope="module")
def with_tools_template(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a chat template that renders tools, tool calls and tool results (Qwen's shape)."""
    out = tmp_path_factory.mktemp("tiny-tools")
    for item in tiny_qwen3.iterdir():
        if item.is_file():
            shutil.copy(item, out / item.name)
    (out / "chat_template.jinja").write_text(TOOLS_TEMPLATE)
    return out


def example_rollout(checkpoint: Path, root: Path, plugin: str, question: str, samples: int, server_url: str) -> Any:
    """One rollout of `samples` agents of the example plugins/<plugin>.py (its generate and tool_reward) asked
    `question`, their tool calls parsed by SGLang's qwen25 parser: the group, the metrics and each /generate sent."""
    (root / "train.jsonl").write_text(json.dumps({"prompt": [{"role": "user", "content": question}]}) + "\n")
    args = agent_args(
        checkpoint, root, f"plugins.{plugin}.generate",
        "--custom-rm-path", f"plugins.{plugin}.tool_reward", "--sglang-tool-call-parser", "qwen25",
        samples=samples, max_response_len=256,
    )  # fmt: skip
    groups, metrics, sent = recorded_rollout(args, server_url)
    return groups[0], metrics, sent


@pytest.fixture(scope="module")
def rollout(with_tools_template: Path, sglang_server: SGLangServer, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("agents-sdk")
    return example_rollout(with_tools_template, root, "openai_agents_example", "double 3", N, sglang_server.url)[:2]


def test_the_sdk_agent_calls_its_tool_and_answers(rollout, with_tools_template: Path) -> None:
    from transformers import AutoTokenizer

    group, metrics = rollout
    tokenizer = AutoTokenizer.from_pretrained(with_tools_template)
    assert len(group) == N and metrics["rollout/openai_tool_calls"] == N and metrics["rollout/openai_turns"] == 2 * N
    for sample in group:
        assert sample.status == Status.COMPLETED and sample.metadata["openai_turns"] == 2, sample.metadata
        (result,) = sample.metadata["tool_results"]
        response = sample.tokens[sample.prompt_length :]
        model = tokenizer.decode([t for t, m in zip(response, sample.loss_mask, strict=True) if m])
        context = tokenizer.decode([t for t, m in zip(response, sample.loss_mask, strict=True) if not m])
        digit = int(json.loads(model.split("<tool_call>\n")[1].split("\n</tool_call>")[0])["arguments"]["digit"])
        assert result == str(2 * digit)  # the SDK ran our Python tool on the model's arguments
        assert f"<tool_response>\n{result}\n</tool_response>" in context  # ... and sent its result back
        assert model.endswith(sample.metadata["agent_answer"] + "<|im_end|>")  # the answer the SDK returned
        assert sample.reward == float(sample.metadata["agent_answer"] == result)


def test_the_trajectories_train_with_megatron_log_probs_equal_to_sglang(
    rollout, with_tools_template: Path, sglang_server: SGLangServer
) -> None:
    """Megatron scores the trained ids as SGLang does (teacher forcing, within 1e-4). The sampled log-probs are the
    grammar-constrained sampler's (the regexes): masking only removes choices, so they are never below the model's."""
    from rollout import sglang_client as client
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.optimizer import OptimizerSettings
    from slime_like.trainer.megatron.parallel import init_parallel

    group, _ = rollout
    data = build_train_data([group])
    init_parallel(tp=1, pp=1, seed=1234)
    engine = MegatronTrainEngine(with_tools_template, OptimizerSettings(lr=1e-3), max_tokens_per_micro_batch=512)
    logprobs = engine.forward_logprobs(data.tokens)
    per_sample = zip(logprobs, data.tokens, data.response_lengths, data.rollout_log_probs, data.loss_masks, strict=True)
    for lp, tokens, n, sampled, mask in per_sample:
        probe = torch.tensor(client.prompt_logprobs(sglang_server.url, tokens)[-n:])
        assert (lp[-n:] - probe).abs().max() < 1e-4
        model = torch.tensor(mask, dtype=torch.bool)
        assert (torch.tensor(sampled)[model] >= probe[model] - 1e-4).all()

    def loss(per_sequence, rows):  # rows: (response length, loss mask) of this micro-batch's sequences
        terms = [-(lp[-n:] * torch.tensor(mask)).sum() for lp, (n, mask) in zip(per_sequence, rows, strict=True)]
        return sum(terms) / sum(map(sum, data.loss_masks))

    before = engine.forward_logprobs(data.tokens)
    rows = list(zip(data.response_lengths, data.loss_masks, strict=True))
    out = engine.train_step(data.tokens, rows, loss)
    after = engine.forward_logprobs(data.tokens)
    assert torch.isfinite(torch.tensor(out["loss"]))
    assert (torch.cat(after) - torch.cat(before)).abs().max() > 1e-4
