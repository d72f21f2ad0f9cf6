"""The default generate function: one `/generate` request per sample through the router, token in, token out."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from buffer import multimodal as mm
from rollout import sglang_client as client
from rollout.context import RolloutContext
from rollout.pause import streams_versions
from slime_like.core.errors import EngineError
from slime_like.core.sample import ROUTED_EXPERTS_KEY, Sample, Status, decode_routed_experts

logger = logging.getLogger(__name__)

__all__ = [
    "RolloutContext",
    "generate",
    "post_generate",
    "prompt_token_ids",
    "sample_prompt_ids",
    "sampling_params_from_args",
]

FINISH_STATUS = {"length": Status.TRUNCATED, "abort": Status.ABORTED}
# A sample in one of these states is not generated again when its group comes back from the buffer.
FINISHED = (Status.COMPLETED, Status.TRUNCATED, Status.FAILED)


class AbortedBeforeSending(Exception):
    """The rollout started aborting before this request went out: nothing was sent."""


def sampling_params_from_args(args: Any) -> dict[str, Any]:
    """SGLang sampling parameters from the `--rollout-*` flags."""
    params = {
        "temperature": args.rollout_temperature,
        "top_p": args.rollout_top_p,
        "top_k": args.rollout_top_k,
        "max_new_tokens": args.rollout_max_response_len,
        "skip_special_tokens": bool(getattr(args, "rollout_skip_special_tokens", False)),
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
        # Rendered to text first: transformers 5 returns a BatchEncoding (not ids) from tokenize=True.
        prompt = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])


def sample_prompt_ids(ctx: RolloutContext, sample: Sample) -> list[int]:
    """A new sample's prompt ids: a text prompt's from the tokenizer (chat messages through its template); an image
    sample's (multimodal_inputs) from the checkpoint's processor, each image's pad expanded to its tokens, which also
    gives the sample its multimodal_train_inputs (the processor's tensors of those images) when it has none."""
    images = mm.sample_images(sample)
    if not images:
        return prompt_token_ids(ctx.tokenizer, sample.prompt)
    processor = mm.load_processor(ctx.args.hf_checkpoint)
    kwargs = getattr(ctx.args, "apply_chat_template_kwargs", None)
    ids, train_inputs = mm.prompt_inputs(processor, sample.prompt, images, kwargs)
    if sample.multimodal_train_inputs is None:
        sample.multimodal_train_inputs = train_inputs
    return ids


async def abort_rid(ctx: RolloutContext, rid: str) -> None:
    """Best-effort abort of one request on every server (a failed attempt may still run on one of them)."""
    for url in ctx.server_urls:
        try:
            await client.abort_request(ctx.session, url, rid)
        except EngineError as exc:
            logger.debug("abort of %s failed: %s", rid, exc)


def with_adapter(args: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """A /generate payload naming the policy's LoRA adapter in a LoRA run (--lora-rank), where the servers hold
    the policy as that adapter on the base model; the payload unchanged otherwise or when it names one itself."""
    if not getattr(args, "lora_rank", 0) or payload.get("lora_path"):
        return payload
    if getattr(args, "lora_adapter_names", None):  # multi-LoRA: no default adapter; call_model names the sample's
        raise ValueError(
            "a multi-LoRA run (--multi-lora-adapter) has no default adapter: this /generate must name its sample's "
            f"adapter (payload['lora_path'] = sample.metadata[{client.LORA_ADAPTER_KEY!r}])"
        )
    return {**payload, "lora_path": client.LORA_ADAPTER_NAME}


async def post_generate(
    ctx: RolloutContext, payload: dict[str, Any], retries: int | None = None, on_ids: client.OnIds | None = None
) -> dict[str, Any]:
    """POST /generate with retries on connection errors and 5xx answers; each attempt has its own rid; a LoRA run's
    requests name its adapter (with_adapter). With `on_ids` the answer is streamed and `on_ids` awaited with the
    new ids as they come; an attempt that failed after handing some on is not retried (they cannot be taken back).

    Raises AbortedBeforeSending when the rollout is aborting, EngineError when every attempt failed.
    """
    payload = with_adapter(ctx.args, payload)
    if retries is None:
        # With --use-fault-tolerance keep retrying (about 50 s of waits): a dead engine stays in the router until its
        # next health check, and a dead router is restarted (about 10 s) once the first failure wakes its check.
        retries = 12 if getattr(ctx.args, "use_fault_tolerance", False) else 3
    delay = 0.5
    base_rid = payload.get("rid") or uuid.uuid4().hex
    handed = 0

    async def hand_on(ids: list[int]) -> None:
        nonlocal handed
        handed += len(ids)
        await on_ids(ids)  # type: ignore[misc]  # only passed on when given

    if on_ids is not None:
        payload = {**payload, "stream": True}
    for attempt in range(retries + 1):
        rid = f"{base_rid}-{attempt}"
        async with ctx.semaphore:
            # Checked after the wait for a slot: requests queued here when an abort starts are never sent.
            if ctx.aborting:
                raise AbortedBeforeSending(rid)
            ctx.inflight.add(rid)
            url = _target(ctx, payload)  # per attempt: a restarted router may have moved, an engine be down
            try:
                return await client.generate_async(
                    ctx.session, url, {**payload, "rid": rid}, hand_on if on_ids is not None else None
                )
            except client.GenerateRefused:  # the request itself is wrong: retrying cannot help
                raise
            except EngineError as exc:
                error = f"{url}{exc}"  # names the router (or server) the request went to
                if ctx.request_failed is not None:
                    ctx.request_failed()
            finally:
                ctx.inflight.discard(rid)
        # The failed attempt may still be generating on a server: stop it before retrying under a new rid.
        await abort_rid(ctx, rid)
        if handed:
            raise EngineError(f"{error} (after {handed} streamed tokens were handed on: not retried)")
        if attempt < retries and not ctx.aborting:
            ctx.count("generate_retries")
            logger.warning("%s; retry %d/%d in %.1fs", error, attempt + 1, retries, delay)
            await asyncio.sleep(delay)
            delay = min(2 * delay, 5.0)
    raise EngineError(error)


def _target(ctx: RolloutContext, payload: dict[str, Any]) -> str:
    """The router, or for an R3 request the next engine in turn: sglang-router 0.3.2 drops `return_routed_experts`
    from the requests it passes on (measured: the answer through the router has no routed experts), so those go to
    the engines directly, round robin (a retry goes to the next one)."""
    if not payload.get("return_routed_experts") or not ctx.server_urls:
        return ctx.router_url
    ctx.engine_turn += 1
    return ctx.server_urls[ctx.engine_turn % len(ctx.server_urls)]


def append_model_tokens(sample: Sample, out: dict[str, Any]) -> list[int]:
    """Append a /generate answer's tokens, log-probs (loss mask 1), text and weight versions to the sample; returns
    the new tokens."""
    meta = out["meta_info"]
    new_tokens = [int(t[1]) for t in meta["output_token_logprobs"]]
    sample.tokens = sample.tokens + new_tokens
    sample.response += out["text"]
    sample.response_length += len(new_tokens)
    sample.rollout_log_probs = (sample.rollout_log_probs or []) + [float(t[0]) for t in meta["output_token_logprobs"]]
    sample.loss_mask = (sample.loss_mask or []) + [1] * len(new_tokens)
    sample.add_version_spans(len(new_tokens), meta)  # per token when streamed (the answer may span an update)
    version = meta.get("weight_version")
    sample.weight_version = int(version) if version is not None and str(version).isdigit() else None
    return new_tokens


def finish_status(ctx: RolloutContext, out: dict[str, Any]) -> tuple[Status, str | None]:
    """The sample status a /generate answer means; an abort the rollout did not ask for is a failure."""
    reason = out["meta_info"].get("finish_reason") or {}
    status = FINISH_STATUS.get(reason.get("type"), Status.COMPLETED)
    if status == Status.ABORTED and not ctx.aborting:
        # SGLang also answers `abort` when it rejects a request (e.g. prompt too long): retrying cannot help.
        return Status.FAILED, str(reason.get("message") or reason)
    return status, None


async def call_model(ctx: RolloutContext, sample: Sample, params: dict[str, Any]) -> dict[str, Any] | None:
    """One /generate on the sample's tokens; on failure or abort sets the status and returns None."""
    rid = f"sample-{sample.index}-{uuid.uuid4().hex[:8]}"
    sample.metadata["rid"] = rid
    payload = {"input_ids": sample.tokens, "sampling_params": params, "return_logprob": True, "rid": rid}
    images = mm.sample_images(sample)
    if images:  # every image of the sequence, in the order of its tokens (SGLang keeps the ids: sglang_vlm.py)
        payload["image_data"] = [mm.image_data_url(image) for image in images]
    if sample.metadata.get(client.LORA_ADAPTER_KEY):  # multi-LoRA: the adapter this sample's prompt belongs to
        payload["lora_path"] = sample.metadata[client.LORA_ADAPTER_KEY]
    if streams_versions(ctx.args):  # weights may change under the request: learn each token's version
        payload["stream"] = True
    replay = getattr(ctx.args, "use_rollout_routing_replay", False) and not ctx.evaluation
    if replay:  # R3: the experts SGLang routes every token of the sequence to, for the trainer to replay
        payload["return_routed_experts"] = True
    try:
        out = await post_generate(ctx, payload)
    except AbortedBeforeSending:
        sample.status = Status.ABORTED
        return None
    except RuntimeError as exc:
        logger.warning("sample %s: generation failed: %s", sample.index, exc)
        sample.status = Status.FAILED
        sample.metadata["generate_error"] = str(exc)
        return None
    served = out["meta_info"].get("prompt_tokens")
    if images and served is not None and served != len(payload["input_ids"]):
        # SGLang tokenised the sequence again (a server not started by rollout/sglang_launch.py: sglang_vlm.py)
        sample.status = Status.FAILED
        sample.metadata["generate_error"] = (
            f"the server read {served} prompt tokens for the {len(payload['input_ids'])} ids sent with images: start "
            "SGLang through rollout.sglang_launch (rollout/sglang_vlm.py keeps image requests' ids as sent)"
        )
        logger.warning("sample %s: %s", sample.index, sample.metadata["generate_error"])
        return None
    if replay:
        take_routed_experts(ctx.args, sample, out)
    return out


def take_routed_experts(args: Any, sample: Sample, out: dict[str, Any]) -> None:
    """R3: move an answer's routed experts into the sample, [tokens - 1, layers, topk] over the sequence sent and
    the answer's tokens (its prompt included, so they replace a partial request's); a request aborted before
    SGLang routed anything leaves the sample's as they were."""
    encoded = out["meta_info"].pop(ROUTED_EXPERTS_KEY, None)  # popped: append_response_tokens would decode it again
    if encoded is None:
        return
    rows = len(sample.tokens) + len(out["meta_info"].get("output_token_logprobs") or []) - 1
    try:
        sample.rollout_routed_experts = decode_routed_experts(encoded, rows, args.num_layers, args.moe_router_topk)
    except ValueError:
        if (out["meta_info"].get("finish_reason") or {}).get("type") != "abort":
            raise
        # An aborted answer's capture may stop short; the continuation's answer covers the whole sequence again.
        logger.debug("sample %s: aborted answer's routed experts do not cover its tokens; left out", sample.index)


async def generate(ctx: RolloutContext, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """Generate (or continue) one sample's response, recording tokens, log-probs, status and weight version."""
    if not sample.tokens:
        sample.tokens = sample_prompt_ids(ctx, sample)
    params = dict(sampling_params)
    # A partially generated sample continues where it stopped, within the same length budget.
    params["max_new_tokens"] = sampling_params["max_new_tokens"] - sample.response_length
    context = getattr(ctx.args, "rollout_max_context_len", None)
    if "eval_dataset" in sample.metadata and getattr(ctx.args, "eval_max_context_len", None) is not None:
        context = ctx.args.eval_max_context_len  # an eval sample (evaluation.py names its dataset)
    if context is not None:  # prompt + response within --rollout-max-context-len (tokens holds both so far)
        params["max_new_tokens"] = min(params["max_new_tokens"], context - len(sample.tokens))
    if params["max_new_tokens"] <= 0:
        sample.status = Status.TRUNCATED
        return sample
    # A per-sample seed makes sampling reproducible on servers run with --enable-deterministic-inference.
    params.setdefault("sampling_seed", (ctx.args.rollout_seed * 1_000_003 + (sample.index or 0)) % (2**31))
    out = await call_model(ctx, sample, params)
    if out is None:
        return sample
    append_model_tokens(sample, out)
    sample.status, error = finish_status(ctx, out)
    if error:
        sample.metadata["generate_error"] = error
    return sample
