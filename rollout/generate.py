"""The default generate function: one `/generate` request per sample through the router."""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from slime_like.sample import Sample, Status

logger = logging.getLogger(__name__)

FINISH_STATUS = {"length": Status.TRUNCATED, "abort": Status.ABORTED}


@dataclass
class RolloutContext:
    """What a generate function needs: arguments, tokenizer and an HTTP session to the router."""

    args: Any
    tokenizer: Any
    router_url: str
    session: aiohttp.ClientSession
    semaphore: asyncio.Semaphore
    counters: dict[str, int] = field(default_factory=dict)

    def count(self, key: str, n: int = 1) -> None:
        """Add to a named counter reported in the rollout metrics."""
        self.counters[key] = self.counters.get(key, 0) + n


def sampling_params_from_args(args: Any) -> dict[str, Any]:
    """SGLang sampling parameters from the `--rollout-*` flags."""
    params = {
        "temperature": args.rollout_temperature,
        "top_p": args.rollout_top_p,
        "top_k": args.rollout_top_k,
        "max_new_tokens": args.rollout_max_response_len,
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    if args.rollout_stop:
        params["stop"] = list(args.rollout_stop)
    if args.rollout_stop_token_ids:
        params["stop_token_ids"] = list(args.rollout_stop_token_ids)
    return params


def prompt_token_ids(tokenizer: Any, prompt: str | list[dict[str, Any]]) -> list[int]:
    """Token ids of a prompt string, or of chat messages through the tokenizer's chat template."""
    if isinstance(prompt, list):
        return list(tokenizer.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True))
    return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])


async def post_generate(ctx: RolloutContext, payload: dict[str, Any], retries: int = 3) -> dict[str, Any]:
    """POST /generate with retries on connection errors and 5xx answers (a server may be restarting)."""
    delay = 0.5
    for attempt in range(retries + 1):
        try:
            async with ctx.semaphore, ctx.session.post(f"{ctx.router_url}/generate", json=payload) as resp:
                if resp.status < 500:
                    body = await resp.json(content_type=None)
                    if resp.status != 200:
                        raise RuntimeError(f"/generate answered {resp.status}: {body}")
                    return body
                error = f"/generate answered {resp.status}: {(await resp.text())[:300]}"
        except (TimeoutError, aiohttp.ClientConnectionError) as exc:
            error = f"/generate failed: {exc!r}"
        if attempt < retries:
            ctx.count("generate_retries")
            logger.warning("%s; retry %d/%d in %.1fs", error, attempt + 1, retries, delay)
            await asyncio.sleep(delay)
            delay *= 2
    raise RuntimeError(error)


async def generate(ctx: RolloutContext, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """Generate (or continue) one sample's response, recording tokens, log-probs, status and weight version."""
    if not sample.tokens:
        sample.tokens = prompt_token_ids(ctx.tokenizer, sample.prompt)
    params = dict(sampling_params)
    # A partially generated sample continues where it stopped, within the same length budget.
    params["max_new_tokens"] = sampling_params["max_new_tokens"] - sample.response_length
    if params["max_new_tokens"] <= 0:
        sample.status = Status.TRUNCATED
        return sample
    # A per-sample seed makes sampling reproducible on servers run with --enable-deterministic-inference.
    params.setdefault("sampling_seed", (ctx.args.rollout_seed * 1_000_003 + (sample.index or 0)) % (2**31))
    rid = f"sample-{sample.index}-{uuid.uuid4().hex[:8]}"
    sample.metadata["rid"] = rid
    payload = {"input_ids": sample.tokens, "sampling_params": params, "return_logprob": True, "rid": rid}
    try:
        out = await post_generate(ctx, payload)
    except RuntimeError as exc:
        logger.warning("sample %s: generation failed: %s", sample.index, exc)
        sample.status = Status.FAILED
        sample.metadata["generate_error"] = str(exc)
        return sample
    meta = out["meta_info"]
    new_tokens = [int(t[1]) for t in meta["output_token_logprobs"]]
    new_logprobs = [float(t[0]) for t in meta["output_token_logprobs"]]
    sample.tokens = sample.tokens + new_tokens
    sample.response += out["text"]
    sample.response_length += len(new_tokens)
    sample.rollout_log_probs = (sample.rollout_log_probs or []) + new_logprobs
    sample.loss_mask = (sample.loss_mask or []) + [1] * len(new_tokens)
    sample.status = FINISH_STATUS.get((meta.get("finish_reason") or {}).get("type"), Status.COMPLETED)
    version = meta.get("weight_version")
    sample.weight_version = int(version) if version is not None and str(version).isdigit() else None
    return sample
