"""slime.rollout.sglang_rollout: GenerateState, the default generate and generate-and-score, over our rollout.

They work inside a rollout of ours (a generate function, a rollout function or code they call): the running
rollout's router, tokenizer, HTTP session, hooks and abort state stand in for slime's global state.
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from slime.rollout.base_types import RolloutFnTrainOutput
from slime.utils.misc import SingletonMeta, load_function
from slime.utils.processing_utils import load_tokenizer
from slime.utils.types import Sample, Status

from rollout import generate as ours
from rollout import sampling
from rollout.context import RolloutContext, current_context
from rollout.slime_contract import SlimeDataSource, leaves, slime_args

__all__ = ["GenerateState", "generate", "generate_and_rm", "generate_and_rm_group", "generate_rollout", "get_model_url"]


def _context(what: str) -> RolloutContext:
    ctx = current_context()
    if ctx is None:
        raise RuntimeError(f"slime.rollout.sglang_rollout.{what} runs inside a slime_like rollout (none is running)")
    return ctx


class GenerateState(metaclass=SingletonMeta):
    """slime's rollout state; its attributes read the running rollout (the first `args` is kept, as in slime)."""

    def __init__(self, args: Any) -> None:
        self._args = args
        self._tokenizer: Any = None
        self._processor: Any = None
        self.remaining_batch_size = 0
        self.pendings: set[asyncio.Task[Any]] = set()
        self.dp_counts = [0]
        self.dp_rank = 0

    @property
    def args(self) -> Any:
        """The running rollout's arguments (slime's view of them), else those of the first call."""
        ctx = current_context()
        return slime_args(ctx.args) if ctx is not None else self._args

    @property
    def tokenizer(self) -> Any:
        """The running rollout's tokenizer, else one loaded from --hf-checkpoint."""
        ctx = current_context()
        if ctx is not None:
            return ctx.tokenizer
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self._args.hf_checkpoint)
        return self._tokenizer

    @property
    def processor(self) -> Any:
        """The checkpoint's multimodal processor for a --multimodal-keys run (slime's), None for a text run."""
        if self._processor is None and getattr(self.args, "multimodal_keys", None):
            from buffer.multimodal import load_processor

            self._processor = load_processor(self.args.hf_checkpoint)
        return self._processor

    @processor.setter
    def processor(self, value: Any) -> None:
        self._processor = value

    @property
    def semaphore(self) -> asyncio.Semaphore:
        """Bounds concurrent generate calls of this rollout (--sglang-server-concurrency x servers)."""
        ctx = _context("GenerateState.semaphore")
        if "slime_semaphore" not in ctx.plugin_state:
            limit = ctx.args.sglang_server_concurrency * max(1, len(ctx.server_urls))
            ctx.plugin_state["slime_semaphore"] = asyncio.Semaphore(limit)
        return ctx.plugin_state["slime_semaphore"]

    @property
    def sampling_params(self) -> dict[str, Any]:
        """The --rollout-* sampling parameters (slime's set)."""
        params = ours.sampling_params_from_args(self.args)
        params["spaces_between_special_tokens"] = False
        return params

    @property
    def aborted(self) -> bool:
        """True while the running rollout aborts what still runs."""
        ctx = current_context()
        return ctx is not None and ctx.aborting

    def reset(self) -> None:
        """Forget submitted tasks."""
        self.remaining_batch_size = 0
        self.pendings = set()

    @contextmanager
    def dp_rank_context(self) -> Iterator[int]:
        """The data-parallel rank of the server to use: always 0 (the router balances)."""
        yield 0

    def submit_generate_tasks(self, samples: list[list[Sample]]) -> None:
        """Start generate_and_rm_group for each group (tasks in `pendings`)."""
        for group in samples:
            task = asyncio.ensure_future(
                generate_and_rm_group(self.args, group, self.sampling_params, evaluation=False)
            )
            self.pendings.add(task)
        self.remaining_batch_size += len(samples)


def get_model_url(args: Any, model_name: str | None = None, endpoint: str = "/generate") -> str:
    """The router of model `model_name` of --sglang-config (args.sglang_model_routers, as slime), else the policy's
    router, for `endpoint`."""
    routers = getattr(args, "sglang_model_routers", None) or {}
    if model_name in routers:
        host, port = routers[model_name]
        return f"http://{host}:{port}{endpoint}"
    return f"{_context('get_model_url').router_url}{endpoint}"


async def generate(args: Any, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """slime's default generate: continue the sample from its tokens through the router (one /generate, with our
    retries and abort handling), appended with `Sample.append_response_tokens` as slime does."""
    ctx = _context("generate")
    assert sample.status in (Status.PENDING, Status.ABORTED), f"sample {sample.index} is {sample.status}"
    if not sample.tokens:
        sample.tokens = ours.sample_prompt_ids(ctx, sample)  # an image sample's through the processor
    params = dict(sampling_params)
    params["max_new_tokens"] = sampling_params["max_new_tokens"] - sample.response_length
    context = getattr(ctx.args, "rollout_max_context_len", None)
    if context is not None:  # as rollout.generate.generate: prompt + response within the context budget
        params["max_new_tokens"] = min(params["max_new_tokens"], context - len(sample.tokens))
    if params["max_new_tokens"] <= 0:
        sample.status = Status.TRUNCATED
        return sample
    out = await ours.call_model(ctx, sample, params)  # None: aborted or failed, status set
    if out is None:
        return sample
    meta = out["meta_info"]
    sample.append_response_tokens(
        args,
        tokens=[int(t[1]) for t in meta["output_token_logprobs"]],
        log_probs=[float(t[0]) for t in meta["output_token_logprobs"]],
        meta_info=meta,
        text=out["text"],
    )
    sample.status, error = ours.finish_status(ctx, out)  # an abort the rollout did not ask for is a failure
    if error:
        sample.metadata["generate_error"] = error
    return sample


async def _generate_one(
    ctx: RolloutContext, args: Any, sample: Sample, params: dict[str, Any], evaluation: bool
) -> Any:
    path = sample.generate_function_path
    if not path:
        out = await ctx.hooks.generate(ctx, sample, params)  # the run's generate function, adapted to ours
        return out[0] if isinstance(out, list) and len(out) == 1 and out[0] is sample else out
    fn = load_function(path)
    with_evaluation = "evaluation" in inspect.signature(fn).parameters
    return await fn(args, sample, params, **({"evaluation": evaluation} if with_evaluation else {}))


async def generate_and_rm(
    args: Any, sample: Sample | list[Sample], sampling_params: dict[str, Any], evaluation: bool = False
) -> Sample | list[Sample]:
    """Generate a sample with the run's generate function (or its own generate_function_path), then score
    what has no reward yet (nothing under --group-rm: the group is scored together)."""
    ctx = _context("generate_and_rm")
    if isinstance(sample, list):
        return list(
            await asyncio.gather(*(generate_and_rm(args, s, dict(sampling_params), evaluation) for s in sample))
        )
    if args.partial_rollout and args.mask_offpolicy_in_partial_rollout and sample.response_length:
        sample.loss_mask = [0] * sample.response_length
    if sample.status in (Status.COMPLETED, Status.TRUNCATED):
        return sample
    async with GenerateState(args).semaphore:
        if ctx.aborting:
            sample.status = Status.ABORTED
            return sample
        out = await _generate_one(ctx, args, sample, sampling_params, evaluation)
    done = leaves(out)
    if args.group_rm or any(s.status == Status.ABORTED for s in done):
        return out
    await ctx.hooks.reward.score_group(ctx.args, done, ctx.count, keep_set=True)
    return out


async def generate_and_rm_group(
    args: Any, group: list[Sample], sampling_params: dict[str, Any], evaluation: bool = False
) -> list[Any]:
    """generate_and_rm on every sample of a group (each with its own copy of the parameters); with --group-rm
    the group's samples are scored together. An element is a list where a sample was fanned out."""
    ctx = _context("generate_and_rm_group")
    if ctx.aborting:
        return group
    for sample in group:
        if sample.session_id is None:
            sample.session_id = str(uuid.uuid4())
    out = await asyncio.gather(*(generate_and_rm(args, s, dict(sampling_params), evaluation) for s in group))
    done = leaves(list(out))
    if not ctx.aborting and args.group_rm and not any(s.status == Status.ABORTED for s in done):
        await ctx.hooks.reward.score_group(ctx.args, done, ctx.count)
    return list(out)


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> RolloutFnTrainOutput:
    """slime's default rollout function: ours (over-sampling, dynamic filter, abort and buffer return)."""
    from slime.utils.async_utils import run

    if evaluation:
        raise NotImplementedError("evaluate with --eval-prompt-data (the built-in eval), not the rollout function")
    if not isinstance(data_source, SlimeDataSource):
        raise TypeError("slime.rollout.sglang_rollout.generate_rollout needs the data_source slime_like passes")
    ctx = _context("generate_rollout")
    params = ours.sampling_params_from_args(ctx.args)
    return RolloutFnTrainOutput(samples=run(sampling.generate_rollout(ctx, data_source.buffer, params)))
