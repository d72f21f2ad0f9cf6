"""A long-tail workload with controlled lengths, for benchmarks: `--custom-generate-function-path
plugins.long_tail_generate.generate`.

Reasoning RL has a long tail: most responses are short and a few are many times longer, and a synchronous step
waits for the longest. This generate function makes that tail deterministic: every training sample generates
exactly its budget of tokens (SGLang's `ignore_eos`, stop strings and stop tokens off), `--rollout-max-response-len`
tokens, times the row's `metadata.response_len_factor` (e.g. 8 on one row in ten; 1 when absent).

What follows the first stop token (`--rollout-stop-token-ids`, or the tokenizer's EOS) is not the answer: the
reward sees the response up to that token and the loss mask is 0 after it, so the task learns as with ordinary
sampling while the engines and the trainer still process every token. Evaluation samples are generated as usual.
"""

from __future__ import annotations

from typing import Any

from rollout.context import RolloutContext
from rollout.generate import generate as default_generate
from slime_like.core.sample import Sample, Status

FACTOR_KEY = "response_len_factor"


def budget(sample: Sample, sampling_params: dict[str, Any]) -> int:
    """The sample's exact response length: the rollout's budget times its row's factor."""
    factor = sample.metadata.get(FACTOR_KEY, 1)
    if not isinstance(factor, int) or factor < 1:
        raise ValueError(f"metadata {FACTOR_KEY}={factor!r} of prompt {sample.prompt!r} must be a positive integer")
    return int(sampling_params["max_new_tokens"]) * factor


def stop_ids(ctx: RolloutContext, sampling_params: dict[str, Any]) -> set[int]:
    """Token ids that end an answer: the rollout's stop tokens and the tokenizer's EOS."""
    ids = set(sampling_params.get("stop_token_ids") or [])
    if ctx.tokenizer.eos_token_id is not None:
        ids.add(int(ctx.tokenizer.eos_token_id))
    return ids


def cut_at_answer(ctx: RolloutContext, sample: Sample, stops: set[int]) -> None:
    """Reward text up to the first stop token; loss mask 0 after it; COMPLETED if the answer ended."""
    response = sample.tokens[len(sample.tokens) - sample.response_length :]
    end = next((i + 1 for i, t in enumerate(response) if t in stops), None)
    sample.metadata["answer_tokens"] = end if end is not None else len(response)
    if end is None:
        return  # no answer ended within the budget: truncated, scored on everything (as ordinary sampling)
    sample.response = ctx.tokenizer.decode(response[:end], skip_special_tokens=False)
    mask = sample.loss_mask if sample.loss_mask is not None else [1] * len(response)
    sample.loss_mask = mask[:end] + [0] * (len(response) - end)
    sample.status = Status.COMPLETED


async def generate(ctx: RolloutContext, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """Generate exactly `budget` tokens (continuing a partial sample within it), then mark where the answer ends."""
    if "eval_dataset" in sample.metadata:
        return await default_generate(ctx, sample, sampling_params)
    params = {k: v for k, v in sampling_params.items() if k not in ("stop", "stop_token_ids")}
    params.update(max_new_tokens=budget(sample, sampling_params), ignore_eos=True)
    await default_generate(ctx, sample, params)
    if sample.status == Status.TRUNCATED:  # the whole budget generated (an aborted one continues later)
        cut_at_answer(ctx, sample, stop_ids(ctx, sampling_params))
    return sample
