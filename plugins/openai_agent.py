"""Train an agent written against the OpenAI API, unchanged: it talks to our OpenAI-compatible endpoint.

    --custom-generate-function-path plugins.openai_agent.generate

runs `example_agent` (two turns with the real `openai` SDK). For your own agent write

    async def my_agent(base_url: str, api_key: str, sample: Sample) -> None:
        client = openai_client(base_url, api_key)  # or openai.AsyncOpenAI(base_url=..., api_key=...): slower
        ...  # any number of chat.completions.create calls; keep what the reward needs in sample.metadata

    async def generate(ctx, sample, sampling_params):
        return await run_openai_agent(ctx, sample, sampling_params, my_agent)

Each sample gets its own session of the rollout's endpoint (rollout.openai_endpoint); the sample's tokens, loss mask
and log-probs are the ids the engines received and sampled in that session. An agent that changes its history (tool
calls sent back as text, trimmed or summarised turns, side requests) branches the session: each branch with model
tokens of its own comes back as one more sample of the group (the sample itself holds the final branch), counted as
`rollout/openai_branches`, and every branch carries the run's reward. The agent must not set them; the reward
function (`--custom-rm-path`, `--rm-type`) scores the sample afterwards, reading `sample.response` or what the agent
put in `sample.metadata`. An agent that raises or runs past its timeout (`AGENT_TIMEOUT_S`, or `timeout=`) marks the
sample `FAILED` with the reason in `metadata["agent_error"]`, counted as `rollout/openai_agent_failed` or
`rollout/openai_agent_timeout` (and `rollout/generate_failed`); the group stays whole. Agents must be `async` and
must not block the event loop (a blocked loop cannot be timed out).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import openai

from rollout.context import RolloutContext
from rollout.openai_endpoint import current_endpoint, endpoint_for
from slime_like.core.sample import Sample, Status

Agent = Callable[[str, str, Sample], Awaitable[None]]

AGENT_TIMEOUT_S = 300.0


def prompt_messages(prompt: Any) -> list[Any]:
    """A sample's prompt as chat messages: its list of messages, or one user message of its text."""
    return list(prompt) if isinstance(prompt, list) else [{"role": "user", "content": prompt}]


def openai_client(base_url: str, api_key: str, *, in_process: bool = True, **kwargs: Any) -> openai.AsyncOpenAI:
    """An AsyncOpenAI client for a session. Inside a rollout its calls are answered by the endpoint in process
    (`in_process`; else over HTTP on the endpoint's shared connection pool): a plain `openai.AsyncOpenAI` goes
    over HTTP and builds an SSL context, ~70 ms of CPU on the rollout's loop per sample (scripts/bench/README.md)."""
    endpoint = current_endpoint()
    http = endpoint.http_client(in_process) if endpoint is not None else None
    return openai.AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http, **kwargs)


async def run_openai_agent(
    ctx: RolloutContext,
    sample: Sample,
    sampling_params: dict[str, Any],
    agent: Agent,
    *,
    timeout: float = AGENT_TIMEOUT_S,
) -> Sample | list[Sample]:
    """Run `agent(base_url, api_key, sample)` against a fresh session and make the sample its trajectory: the
    sample, or when the agent's history branched, the sample (its final branch) then one sample per other branch
    (rollout/openai_session.py), each carrying the run's reward (--openai-branch-reward)."""
    if sample.response_length:
        # Handed back by an aborted rollout: the agent's own state is gone, so it runs again from the prompt.
        sample.tokens, sample.response, sample.response_length = [], "", 0
        sample.loss_mask, sample.rollout_log_probs, sample.version_spans = None, None, []
        ctx.count("openai_agent_restarted")
    async with endpoint_for(ctx) as endpoint:
        session = endpoint.open_session(sample, sampling_params)
        error: str | None = None
        try:
            await asyncio.wait_for(agent(endpoint.base_url(session), endpoint.api_key, sample), timeout)
        except TimeoutError:
            error = f"agent timed out after {timeout:g}s"
            ctx.count("openai_agent_timeout")
        except Exception as exc:  # the agent's failure is this sample's, never the rollout's
            error = f"agent raised {type(exc).__name__}: {exc}"
            if not (session.truncated or session.aborted):
                ctx.count("openai_agent_failed")
        finally:
            await endpoint.close_session(session.id)
    pairs = session.samples(sample)
    if session.aborted:
        sample.status = Status.ABORTED  # comes back from the buffer and runs again
        return sample
    if error is not None and not session.truncated:
        sample.status = Status.FAILED
        sample.metadata["agent_error"] = sample.metadata["generate_error"] = error
        return sample
    if not session.turns:
        sample.status = Status.FAILED
        sample.metadata["agent_error"] = sample.metadata["generate_error"] = "the agent made no model call"
        ctx.count("openai_agent_failed")
        return sample
    for branch, out in pairs:
        # An agent that hit the budget may give up with an error of the endpoint's: the sample is truncated.
        out.status = Status.TRUNCATED if branch.truncated else Status.COMPLETED
    if ctx.evaluation or len(pairs) == 1:
        return sample  # an evaluation scores the agent's final state only
    return [out for _, out in pairs]


async def example_agent(base_url: str, api_key: str, sample: Sample) -> None:
    """Answer, then revise the answer when asked to check it: two turns with the OpenAI SDK."""
    client = openai_client(base_url, api_key, max_retries=0)
    messages = prompt_messages(sample.prompt)
    async with client:
        for follow_up in ("Check your answer and give the final one.", None):
            reply = await client.chat.completions.create(model="policy", messages=messages)
            answer = reply.choices[0].message.content or ""
            messages.append({"role": "assistant", "content": answer})
            # Kept at once: the next turn may find the response budget spent (a 400 that ends the sample TRUNCATED).
            sample.metadata["agent_answer"] = answer
            if follow_up is None or reply.choices[0].finish_reason == "length":
                break
            messages.append({"role": "user", "content": follow_up})


async def generate(ctx: RolloutContext, sample: Sample, sampling_params: dict[str, Any]) -> Sample | list[Sample]:
    """--custom-generate-function-path entry point: `example_agent` on each sample."""
    return await run_openai_agent(ctx, sample, sampling_params, example_agent)
