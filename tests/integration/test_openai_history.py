"""Agents that change their history, as real ones do, on a real SGLang server: every call is served on a branch of
its session (rollout/openai_session.py), every branch trains on exactly the ids SGLang received and sampled, and
Megatron scores them as SGLang does.

The agent (AGENT below, the `openai` SDK) in one run: a tool call (forced by a regex) that it sends back as text in
its own JSON spelling with the result as a user turn; a plain turn; a side request (a title) between turns; a
trimmed middle (two turns dropped); a summary replacing the old turns; and one more turn on the summary."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from buffer.train_data import build_train_data
from rollout.sglang_server import SGLangServer
from slime_like.core.sample import Sample, Status
from tests.integration.recorded_rollout import agent_args, recorded_rollout
from tests.integration.test_openai_agents_sdk import with_tools_template  # noqa: F401  (a fixture)

AGENT = r"""
import json
import openai
from plugins.openai_agent import run_openai_agent

ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}
CALL = r'<tool_call>\n\{"name": "add", "arguments": \{"a": [1-9]\}\}\n</tool_call>'


async def agent(base_url, api_key, sample):
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)

    async def ask(messages, max_tokens=8, **kw):
        reply = await client.chat.completions.create(model="m", messages=messages, tools=[ADD], max_tokens=max_tokens, **kw)
        sample.metadata.setdefault("calls", []).append(len(messages))
        return reply.choices[0].message

    system = {"role": "system", "content": "Be brief."}
    history = [system, {"role": "user", "content": "add 3"}]
    call = (await ask(history, max_tokens=80, extra_body={"regex": CALL})).tool_calls[0]
    # The framework's own spelling of the call, as text, and the tool's result as a user turn.
    text = json.dumps({"name": call.function.name, "arguments": json.loads(call.function.arguments)}, separators=(",", ":"))
    history += [{"role": "assistant", "content": f"<tool_call>{text}</tool_call>"}, {"role": "user", "content": "Result: 6"}]
    history += [{"role": "assistant", "content": (await ask(history)).content or ""}, {"role": "user", "content": "go on"}]
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Title for: add 3"}], max_tokens=4)
    history += [{"role": "assistant", "content": (await ask(history)).content or ""}, {"role": "user", "content": "next"}]
    trimmed = history[:2] + history[-2:]  # the middle dropped to fit the context
    trimmed += [{"role": "assistant", "content": (await ask(trimmed)).content or ""}]
    summary = [system, {"role": "user", "content": "Summary: 3 was added, the result is 6. Answer now."}]
    summary += [{"role": "assistant", "content": (await ask(summary)).content or ""}, {"role": "user", "content": "sure?"}]
    sample.metadata["agent_answer"] = (await ask(summary)).content or ""


async def generate(ctx, sample, params):
    return await run_openai_agent(ctx, sample, params, agent)


def reward(args, sample):
    return float(len(sample.metadata.get("calls", [])))  # the run's own count: the same for all its branches
"""
RUNS = 2


@pytest.fixture(scope="module")
def run(
    with_tools_template: Path,  # noqa: F811
    sglang_server: SGLangServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[list[Sample], dict[str, Any], list[dict[str, Any]]]]:
    root = tmp_path_factory.mktemp("openai-history")
    (root / "train.jsonl").write_text(json.dumps({"prompt": "x"}) + "\n")
    (root / "history_agent.py").write_text(AGENT)
    sys.path.insert(0, str(root))
    args = agent_args(
        with_tools_template, root, "history_agent.generate", "--custom-rm-path", "history_agent.reward",
        "--sglang-tool-call-parser", "qwen25", samples=RUNS, max_response_len=400,
    )  # fmt: skip
    try:
        groups, metrics, sent = recorded_rollout(args, sglang_server.url)
    finally:
        sys.path.remove(str(root))
        sys.modules.pop("history_agent", None)
    yield groups[0], metrics, sent


def sampled_positions(sample: Sample, sent: list[dict[str, Any]]) -> dict[int, tuple[int, float, bool]]:
    """Position in the sample's response -> (id, log-prob, under a regex) of every /generate whose ids sent and
    sampled the sample's tokens hold at that place."""
    out = {}
    for turn in sent:
        pairs = turn["out"]["meta_info"]["output_token_logprobs"]
        ids, start = [int(t[1]) for t in pairs], len(turn["input_ids"])
        if sample.tokens[: start + len(ids)] == turn["input_ids"] + ids:
            constrained = "regex" in turn.get("sampling_params", {})
            for k, (lp, tok) in enumerate((float(t[0]), int(t[1])) for t in pairs):
                out[start + k - sample.prompt_length] = (tok, lp, constrained)
    return out


def test_every_call_is_served_and_every_branch_trains_the_sampled_ids(run: Any) -> None:
    group, metrics, sent = run
    assert all(s.status in (Status.COMPLETED, Status.TRUNCATED) for s in group), [s.metadata for s in group]
    assert metrics["rollout/openai_turns"] == 7 * RUNS == len(sent)  # nothing refused
    assert "rollout/openai_history_mismatch" not in metrics
    # Per run, four new branches: the re-serialised call, the title, the trimmed history, the summary (the last
    # call extends the summary's); each holds tokens of its own, so each is a sample, the summary's the run's own.
    assert metrics["rollout/openai_branches"] == 4 * RUNS and metrics["rollout/openai_reprefill_tokens"] > 0
    runs = [s for s in group if s.metadata.get("openai_branch") == 0]
    assert len(runs) == RUNS and len(group) == 5 * RUNS
    for sample in group:
        response = sample.tokens[sample.prompt_length :]
        assert len(response) == len(sample.loss_mask) == len(sample.rollout_log_probs) == sample.response_length
        sampled = sampled_positions(sample, sent)
        trained = [i for i, m in enumerate(sample.loss_mask) if m]
        assert trained, "a branch without a token of its own is not a sample"
        for i in trained:  # token in, token out: every trained id is one SGLang sampled there, with its log-prob
            assert sampled[i][:2] == (response[i], sample.rollout_log_probs[i])
        assert sample.reward == 6.0  # every branch carries the run's reward (its six calls with tools)
    # A token several branches of a run hold trains once: a trained token and the ids before it never repeat.
    trained = [(s.index, tuple(s.tokens[: s.prompt_length + i + 1])) for s in group for i, m in enumerate(s.loss_mask) if m]  # fmt: skip
    assert len(trained) == len(set(trained))


def test_the_branches_train_with_megatron_log_probs_equal_to_sglang(
    run: Any,
    with_tools_template: Path,  # noqa: F811
) -> None:
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.optimizer import OptimizerSettings
    from slime_like.trainer.megatron.parallel import init_parallel

    group, _, sent = run
    data = build_train_data([group])
    init_parallel(tp=1, pp=1, seed=1234)
    engine = MegatronTrainEngine(with_tools_template, OptimizerSettings(lr=1e-3), max_tokens_per_micro_batch=1024)
    before = engine.forward_logprobs(data.tokens)
    for sample, lp in zip(group, before, strict=True):
        ours = lp[-sample.response_length :]
        for i, (_, logprob, constrained) in sampled_positions(sample, sent).items():
            if sample.loss_mask[i]:
                # Under the regex SGLang samples from the masked distribution: never below the model's log-prob.
                assert logprob >= ours[i] - 1e-4 if constrained else abs(logprob - ours[i]) < 1e-4

    def loss(per_sequence, rows):  # rows: (response length, loss mask) of this micro-batch's sequences
        terms = [-(lp[-n:] * torch.tensor(mask)).sum() for lp, (n, mask) in zip(per_sequence, rows, strict=True)]
        return sum(terms) / sum(map(sum, data.loss_masks))

    out = engine.train_step(data.tokens, list(zip(data.response_lengths, data.loss_masks, strict=True)), loss)
    after = engine.forward_logprobs(data.tokens)
    assert torch.isfinite(torch.tensor(out["loss"])) and (torch.cat(after) - torch.cat(before)).abs().max() > 1e-4
