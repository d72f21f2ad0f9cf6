"""Adapters that run rollout hooks written for slime where our rollout calls hooks (docs/plugins.md).

Each `*_hook` function turns a hook that follows slime's contract into a callable with ours, at the call
boundary: slime hooks get `SlimeArgs` (our arguments under slime's names) instead of a RolloutContext, and
what they return is translated. slime's output types are recognised by their fields (`keep`/`reason`/
`keep_when_insufficient`, `samples`/`metrics`, `data`/`metrics`), so this module imports neither the real
slime nor our stand-in for it (slime_like/compat/slime), and works with both.
"""

from __future__ import annotations

import asyncio
import inspect
import statistics
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from buffer.buffer import Buffer
from rollout.context import RolloutContext, current_context
from rollout.filters import FilterResult
from slime_like.core.sample import EXCLUDED_FROM_LOSS, Sample, Status, scalar_reward

# slime flags that have no counterpart here, with slime's defaults (read by plugins, never acted on).
SLIME_DEFAULTS: dict[str, Any] = {
    "rollout_max_context_len": None,
    "sglang_dp_size": None,
    "sglang_speculative_algorithm": None,
    "sglang_enable_deterministic_inference": False,
    "rollout_global_dataset": True,
    "rewards_normalization": True,
    "calculate_per_token_loss": False,
    "log_probs_chunk_size": -1,
    "allgather_cp": False,
    "recompute_loss_function": False,
    "use_opd": False,
    "get_mismatch_metrics": False,
    "multimodal_keys": None,
    "tool_key": None,
}


class SlimeArgs:
    """Our arguments as slime plugins read them: our flags, the router as `sglang_router_ip`/`_port`, slime's
    defaults for its flags we lack; attributes a plugin sets stay in this view (our arguments are not changed)."""

    def __init__(self, args: Any) -> None:
        object.__setattr__(self, "_args", args)
        object.__setattr__(self, "_own", {})

    def __getattr__(self, name: str) -> Any:
        own = object.__getattribute__(self, "_own")
        if name in own:
            return own[name]
        args = object.__getattribute__(self, "_args")
        if hasattr(args, name):
            return getattr(args, name)
        ctx = current_context()
        if name in ("sglang_router_ip", "sglang_router_port") and ctx is not None:
            url = urlsplit(ctx.router_url)
            return url.hostname if name == "sglang_router_ip" else url.port
        if name == "rollout_num_engines":
            return (
                len(ctx.server_urls)
                if ctx is not None
                else max(1, args.rollout_num_gpus // args.rollout_num_gpus_per_engine)
            )
        if name in SLIME_DEFAULTS:
            return SLIME_DEFAULTS[name]
        raise AttributeError(f"args has no {name!r}: slime_like has no such flag (and no slime default for it)")

    def __setattr__(self, name: str, value: Any) -> None:
        self._own[name] = value

    def __delattr__(self, name: str) -> None:
        del self._own[name]

    def unwrap(self) -> Any:
        """The arguments of ours behind this view."""
        return self._args


_views: dict[int, SlimeArgs] = {}


def slime_args(args: Any) -> SlimeArgs:
    """The one SlimeArgs view of `args` (slime plugins may keep state on args between calls, as in slime)."""
    if isinstance(args, SlimeArgs):
        return args
    view = _views.get(id(args))
    if view is None or view.unwrap() is not args:
        view = _views[id(args)] = SlimeArgs(args)
    return view


def _status(sample: Any) -> None:
    """A status set by code built on the real slime (its own Enum) becomes ours."""
    if not isinstance(sample.status, Status):
        sample.status = Status(getattr(sample.status, "value", sample.status))


def leaves(item: Any) -> list[Sample]:
    """The samples of a Sample or of (nested) lists of them, in order."""
    if isinstance(item, list | tuple):
        return [s for x in item for s in leaves(x)]
    _status(item)
    return [item]


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    params = inspect.signature(fn).parameters.values()
    return any(p.name == name or p.kind == p.VAR_KEYWORD for p in params)


def generate_hook(fn: Callable[..., Any]) -> Callable[..., Any]:
    """slime's `async (args, sample, sampling_params[, evaluation]) -> Sample | list[Sample]` as
    `async (ctx, sample, params) -> list[Sample]` (a sample fanned out into several comes back as all of them)."""
    with_evaluation = _accepts(fn, "evaluation")

    async def generate(ctx: RolloutContext, sample: Sample, params: dict[str, Any]) -> list[Sample]:
        if ctx.aborting:  # slime: nothing new starts once the rollout aborts
            sample.status = Status.ABORTED
            return [sample]
        kwargs = {"evaluation": ctx.evaluation} if with_evaluation else {}
        out = await fn(slime_args(ctx.args), sample, dict(params), **kwargs)  # slime hands each its own copy
        return leaves(out)

    generate.__name__ = getattr(fn, "__name__", "generate")
    return generate


def reward_hook(fn: Callable[..., Any]) -> Callable[..., Any]:
    """slime's `(args, sample | samples, **kwargs)` reward, handed SlimeArgs; async stays async."""
    if inspect.iscoroutinefunction(fn):

        async def reward(args: Any, item: Any) -> Any:
            return await fn(slime_args(args), item)
    else:

        def reward(args: Any, item: Any) -> Any:
            return fn(slime_args(args), item)

    reward.__name__ = getattr(fn, "__name__", "reward")
    return reward


def dynamic_filter_hook(fn: Callable[..., Any]) -> Callable[[Any, list[Sample]], FilterResult]:
    """slime's `(args, group) -> DynamicFilterOutput | bool` as ours; keep_when_insufficient is kept."""
    name = getattr(fn, "__name__", "filter")

    def dynamic_filter(args: Any, group: list[Sample]) -> FilterResult:
        out = fn(slime_args(args), group)
        if hasattr(out, "keep"):
            keep = bool(out.keep)
            return FilterResult(
                keep, out.reason, keep_when_insufficient=bool(getattr(out, "keep_when_insufficient", False))
            )
        keep = bool(out)  # slime accepts a bool (or a 0-dim tensor)
        return FilterResult(keep, None if keep else name)

    dynamic_filter.__name__ = name
    return dynamic_filter


def buffer_filter_hook(fn: Callable[..., Any]) -> Callable[[Any, list[list[Sample]], int], list[list[Sample]]]:
    """slime's `(args, rollout_id, buffer, num_samples)`, which pops what it picks from `buffer`, as ours."""

    def buffer_filter(args: Any, groups: list[list[Sample]], num_groups: int) -> list[list[Sample]]:
        waiting = list(groups)  # its own list to pop from; the Buffer removes what was chosen
        return list(fn(slime_args(args), None, waiting, num_groups))  # slime always passes rollout_id=None

    return buffer_filter


class SlimeDataSource:
    """What slime rollout functions get as `data_source`: slime's DataSource methods over our Buffer."""

    def __init__(self, buffer: Buffer) -> None:
        self.buffer = buffer
        self.metadata: dict[str, Any] = {}

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        """`num_samples` groups: returned ones first, then fresh prompts."""
        return self.buffer.get_groups(num_samples)

    def add_samples(self, samples: list[list[Sample]]) -> None:
        """Hand groups back to be served again."""
        if samples:
            self.buffer.add_groups(samples)

    def get_buffer_length(self) -> int:
        """Groups waiting in the buffer."""
        return len(self.buffer)

    def update_metadata(self, metadata: dict[str, Any]) -> None:
        """Keep plugin metadata (not checkpointed)."""
        self.metadata.update(metadata)

    def get_metadata(self) -> dict[str, Any]:
        """What `update_metadata` kept."""
        return self.metadata

    def save(self, rollout_id: int) -> None:
        """No-op: the buffer is saved with our checkpoints."""

    def load(self, rollout_id: int | None = None) -> None:
        """No-op: the buffer is restored with our checkpoints."""

    def __len__(self) -> int:
        source = self.buffer.source
        dataset = getattr(source, "dataset", None)
        return len(dataset) if dataset is not None else len(source) if hasattr(source, "__len__") else 0


def _groups(samples: Any) -> list[list[Sample]]:
    """slime's train output as our groups: each top-level list is one group (nested fan-out lists flattened);
    a flat list of Samples is grouped by group_index."""
    if samples and all(isinstance(s, Sample) for s in samples):
        by_index: dict[Any, list[Sample]] = {}
        for s in leaves(samples):
            by_index.setdefault(s.group_index if s.group_index is not None else id(s), []).append(s)
        return list(by_index.values())
    return [leaves(group) for group in samples or []]


async def _call_in_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a plain-def slime hook in a worker thread; the coroutines it runs (slime.utils.async_utils.run) go back
    to this loop, and it sees this context (asyncio.to_thread copies context variables)."""
    return await asyncio.to_thread(fn, *args, **kwargs)


def rollout_function_hook(fn: Callable[..., Any]) -> Callable[..., Any]:
    """slime's plain `(args, rollout_id, data_source, evaluation=False) -> RolloutFnTrainOutput | list` as ours;
    its `metrics` are reported as `rollout/<name>`."""
    with_evaluation = _accepts(fn, "evaluation")

    async def rollout(ctx: RolloutContext, rollout_id: int, buffer: Buffer) -> list[list[Sample]]:
        kwargs = {"evaluation": False} if with_evaluation else {}
        out = await _call_in_thread(fn, slime_args(ctx.args), rollout_id, SlimeDataSource(buffer), **kwargs)
        samples = out.samples if hasattr(out, "samples") else out
        for key, value in (getattr(out, "metrics", None) or {}).items():
            ctx.counters[key.removeprefix("rollout/")] = value
        return _groups(samples)

    rollout.__name__ = getattr(fn, "__name__", "rollout")
    return rollout


def eval_function_hook(fn: Callable[..., Any]) -> Callable[..., Any]:
    """slime's plain `(args, rollout_id, data_source, evaluation=True) -> RolloutFnEvalOutput | dict` as ours:
    per dataset eval/<name>/reward_mean, truncated_rate and num_samples, plus its own `metrics`."""
    with_evaluation = _accepts(fn, "evaluation")

    async def evaluate(ctx: RolloutContext, rollout_id: int, datasets: dict[str, Any]) -> dict[str, Any]:
        source = SlimeDataSource(Buffer(_NoPrompts(), None, ctx.args))
        kwargs = {"evaluation": True} if with_evaluation else {}
        out = await _call_in_thread(fn, slime_args(ctx.args), rollout_id, source, **kwargs)
        data = out.data if hasattr(out, "data") else out
        metrics: dict[str, Any] = {}
        for name, result in (data or {}).items():
            rewards = [float(r) for r in result.get("rewards", [])]
            truncated = list(result.get("truncated", []))
            metrics[f"eval/{name}/reward_mean"] = statistics.fmean(rewards) if rewards else 0.0
            metrics[f"eval/{name}/num_samples"] = len(result.get("samples", rewards))
            if truncated:
                metrics[f"eval/{name}/truncated_rate"] = sum(map(bool, truncated)) / len(truncated)
        for key, value in (getattr(out, "metrics", None) or {}).items():
            metrics[key if key.startswith("eval/") else f"eval/{key}"] = value
        return metrics

    evaluate.__name__ = getattr(fn, "__name__", "evaluate")
    return evaluate


class _NoPrompts:
    """The data source of an eval: slime eval functions read their own datasets."""

    def get_groups(self, num_groups: int) -> list[list[Sample]]:
        """An eval has no training prompts to serve."""
        raise RuntimeError("an eval function cannot take training prompts from data_source")


class SlimeSourceAdapter:
    """A data source written for slime (`cls(args)` with get_samples/add_samples/save/load) as ours."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def get_groups(self, num_groups: int) -> list[list[Sample]]:
        """The source's next groups."""
        return [leaves(g) for g in self.source.get_samples(num_groups)]

    def state_dict(self) -> dict[str, Any]:
        """The source's own state_dict() when it has one, else {} (slime's save(rollout_id) files are not used)."""
        own = getattr(self.source, "state_dict", None)
        return {"slime_source": own()} if callable(own) else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` saved."""
        own = getattr(self.source, "load_state_dict", None)
        if callable(own) and "slime_source" in state:
            own(state["slime_source"])

    def __len__(self) -> int:
        return len(self.source) if hasattr(self.source, "__len__") else 0


def data_source_hook(cls: Callable[..., Any]) -> Callable[[Any, Any], SlimeSourceAdapter]:
    """slime's `cls(args)` data source as our `(args, tokenizer) -> source`."""
    return lambda args, tokenizer: SlimeSourceAdapter(cls(slime_args(args)))


def apply_sample_filter(ctx: RolloutContext, groups: list[list[Sample]], fn: Callable[..., Any]) -> None:
    """slime's `(args, groups) -> None`: called once with every kept group; it sets `sample.remove_sample`."""
    fn(slime_args(ctx.args), groups)


def exclude_removed_samples(ctx: RolloutContext, groups: list[list[Sample]]) -> None:
    """slime's `remove_sample`, set by any hook: loss mask 0 as our sample filter's rejects get (the sample still
    counts in its group's statistics). Read by name: a plugin may set it on a Sample of ours too (real slime)."""
    for sample in (s for g in groups for s in g):
        if getattr(sample, "remove_sample", False) and not sample.metadata.get(EXCLUDED_FROM_LOSS):
            sample.exclude_from_loss()
            ctx.count("samples_excluded_from_loss")


def apply_all_samples_process(ctx: RolloutContext, groups: list[list[Sample]], fn: Callable[..., Any]) -> None:
    """slime's `(args, all_samples, data_source) -> None` on every group this rollout generated (the kept `groups`
    and those filtered out), in group order."""
    record = ctx.record
    assert record is not None  # the built-in loop's hook only (rollout/postprocess.py)
    every = sorted(record.generated, key=lambda g: (g[0].group_index is None, g[0].group_index or 0))
    fn(slime_args(ctx.args), every, SlimeDataSource(record.buffer))


def apply_reward_post_process(ctx: RolloutContext, groups: list[list[Sample]], fn: Callable[..., Any]) -> None:
    """slime's `(args, samples) -> (raw_rewards, rewards)` on the flat list: the rewards replace the trainer's
    reward normalisation (metadata["reward_normalized"]); the raw ones are what metrics report."""
    samples = [s for g in groups for s in g]
    out = fn(slime_args(ctx.args), samples)
    if not isinstance(out, list | tuple) or len(out) != 2 or any(len(x) != len(samples) for x in out):
        raise TypeError(f"--custom-reward-post-process-path must return (raw_rewards, rewards), {len(samples)} each")
    for sample, raw, reward in zip(samples, out[0], out[1], strict=True):
        sample.metadata["raw_reward"] = float(raw)
        sample.reward = float(reward)
        sample.metadata["reward_normalized"] = True


def check_reward(reward: Any, reward_key: str | None) -> Any:
    """slime's rewards: a number, or a dict of anything whose `--reward-key` entry is a number."""
    if isinstance(reward, dict):
        scalar_reward(Sample(reward=reward), reward_key)  # raises when the key is missing or not a number
        return reward
    if not isinstance(reward, str | bytes):
        try:
            return float(reward)  # int, float, bool, numpy and 0-dim torch numbers
        except (TypeError, ValueError):
            pass
    raise TypeError(f"a reward must be a number or a dict, got {type(reward).__name__}: {reward!r}")
