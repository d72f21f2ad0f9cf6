"""slime's examples/strands_sglang (copied verbatim to slime_plugins/strands_sglang) runs unchanged on our `slime`
with the real strands-sglang: its SGLangModel calls the session's SGLang server token in, token out (the client from
get_client_from_slime_args), Strands parses the Hermes tool call, runs the example's Python interpreter and sends
the result back, the example's reward scores the boxed answer, and the samples take a Megatron train step.

So that the tiny model follows that path, each /generate is constrained with SGLang's `regex` by a wrapper around
strands-sglang's client (the example is untouched): a tool call first, then the tool's result as the boxed answer.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from buffer.train_data import build_train_data
from rollout.sglang_server import SGLangServer
from slime_like.core.sample import Status
from tests.integration.recorded_rollout import agent_args, recorded_rollout
from tests.integration.test_openai_agents_sdk import with_tools_template  # noqa: F401  (a fixture)

HERE = Path(__file__).resolve().parent
EXAMPLE = "slime_plugins.strands_sglang.generate_with_strands"
N = 2
CALL = r'<tool_call>\n\{"name": "execute_python_code", "arguments": \{"code": "print\(6 \* [1-3]\)"\}\}\n</tool_call>'
RESULT = re.compile(r"<tool_response>\s*(\d+)\s*</tool_response>")


@pytest.fixture(scope="module")
def steered(with_tools_template: Path) -> Iterator[list[dict[str, Any]]]:  # noqa: F811
    """slime_plugins importable (as slime's examples are through PYTHONPATH) and strands-sglang's /generate calls
    constrained and recorded: each as {"input_ids", "out"}."""
    from strands_sglang.client import SGLangClient
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(with_tools_template)
    sent: list[dict[str, Any]] = []
    original = SGLangClient.generate

    async def generate(self: SGLangClient, input_ids: list[int], **kwargs: Any) -> dict[str, Any]:
        result = RESULT.findall(tokenizer.decode(input_ids))
        regex = rf"The answer is \\boxed\{{{result[-1]}\}}\." if result else CALL
        kwargs["sampling_params"] = {**kwargs["sampling_params"], "regex": regex}
        out = await original(self, input_ids, **kwargs)
        sent.append({"input_ids": list(input_ids), "out": out})
        return out

    SGLangClient.generate = generate  # type: ignore[method-assign]
    sys.path.insert(0, str(HERE))
    yield sent
    sys.path.remove(str(HERE))
    SGLangClient.generate = original  # type: ignore[method-assign]
    for name in [m for m in sys.modules if m == "slime_plugins" or m.startswith("slime_plugins.")]:
        del sys.modules[name]


@pytest.fixture(scope="module")
def rollout_run(
    steered: list[dict[str, Any]],
    with_tools_template: Path,  # noqa: F811
    sglang_server: SGLangServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[list[Any], dict[str, Any], list[dict[str, Any]]]:
    """One rollout of N agents of slime's example asked for 6 x 2 (label 12), as its launch script runs it."""
    root = tmp_path_factory.mktemp("strands-sglang")
    (root / "train.jsonl").write_text('{"prompt": "What is 6 times 2? Use the tool.", "label": "12"}\n')
    args = agent_args(
        with_tools_template, root, f"{EXAMPLE}.generate",
        "--custom-rm-path", f"{EXAMPLE}.reward_func", "--label-key", "label",
        samples=N, max_response_len=128,
    )  # fmt: skip
    groups, metrics, _ = recorded_rollout(args, sglang_server.url)
    return groups[0], metrics, steered


def test_the_example_calls_its_tool_and_is_scored(rollout_run, with_tools_template: Path) -> None:  # noqa: F811
    from transformers import AutoTokenizer

    group, _, sent = rollout_run
    tokenizer = AutoTokenizer.from_pretrained(with_tools_template)
    assert len(group) == N and len(sent) == 2 * N  # a tool call and an answer per agent
    for sample in group:
        assert sample.status == Status.COMPLETED, sample.metadata
        assert (sample.tool_iters, sample.tool_calls) == (1, 1)  # the example's ToolLimiter counts
        response = sample.tokens[-sample.response_length :]
        model = tokenizer.decode([t for t, m in zip(response, sample.loss_mask, strict=True) if m])
        context = tokenizer.decode([t for t, m in zip(response, sample.loss_mask, strict=True) if not m])
        digit = int(re.search(r"print\(6 \* (\d)\)", model).group(1))
        assert RESULT.findall(context) == [str(6 * digit)]  # the interpreter ran the model's code
        assert sample.response.endswith(f"The answer is \\boxed{{{6 * digit}}}.<|im_end|>")
        # The example's reward: math_dapo's 1 for the label, else -1 moved by its tool-use term (one iteration).
        assert sample.reward == (1.0 if 6 * digit == 12 else -1.05)
        # Trained ids == sampled ids, the log-probs SGLang's: the model-masked tokens are what SGLang sampled.
        turns = {len(r["input_ids"]): r for r in sent if sample.tokens[: len(ids := r["input_ids"] + r["out"]["output_ids"])] == ids}  # fmt: skip
        mine = [turns[n] for n in sorted(turns)]  # this agent's calls (agents that sampled alike share theirs)
        assert len(mine) == 2
        sampled = [t for turn in mine for t in turn["out"]["output_ids"]]
        assert [t for t, m in zip(response, sample.loss_mask, strict=True) if m] == sampled
        logprobs = [lp for turn in mine for lp, *_ in turn["out"]["meta_info"]["output_token_logprobs"]]
        masked = [lp for lp, m in zip(sample.rollout_log_probs, sample.loss_mask, strict=True) if m]
        assert masked == pytest.approx(logprobs)


def test_the_samples_take_a_megatron_train_step(rollout_run, with_tools_template: Path) -> None:  # noqa: F811
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.optimizer import OptimizerSettings
    from slime_like.trainer.megatron.parallel import init_parallel

    group, _, _ = rollout_run
    data = build_train_data([group])
    assert [list(t) for t in data.tokens] == [s.tokens for s in group]
    init_parallel(tp=1, pp=1, seed=1234)
    engine = MegatronTrainEngine(with_tools_template, OptimizerSettings(lr=1e-3), max_tokens_per_micro_batch=1024)

    def loss(per_sequence, rows):  # rows: (response length, loss mask) of this micro-batch's sequences
        terms = [-(lp[-n:] * torch.tensor(mask)).sum() for lp, (n, mask) in zip(per_sequence, rows, strict=True)]
        return sum(terms) / sum(map(sum, data.loss_masks))

    before = engine.forward_logprobs(data.tokens)
    for lp, n, sampled, mask in zip(before, data.response_lengths, data.rollout_log_probs, data.loss_masks, strict=True):  # fmt: skip
        model = torch.tensor(mask, dtype=torch.bool)  # grammar-constrained sampling only removes choices
        assert (torch.tensor(sampled)[model] >= lp[-n:][model] - 1e-4).all()
    out = engine.train_step(data.tokens, list(zip(data.response_lengths, data.loss_masks, strict=True)), loss)
    after = engine.forward_logprobs(data.tokens)
    assert torch.isfinite(torch.tensor(out["loss"]))
    assert (torch.cat(after) - torch.cat(before)).abs().max() > 1e-4
