"""--rollout-sample-hook-path: functions applied, in order, to each generated sample before it is scored.

slime's contract, which is also ours: `hook(args, sample, *, rollout_id=None, evaluation=False) -> Sample | None`,
plain or async; it may change the sample in place (None) or return the sample that takes its place. It takes only
the keywords it names (or **kwargs).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from slime_like.core.plugin_loader import load_plugin
from slime_like.core.sample import Sample

SAMPLE_HOOK_FLAG = "--rollout-sample-hook-path"
KEYWORDS = ("rollout_id", "evaluation")
# (its path, the function, the keywords of KEYWORDS it takes): read from its signature once, at load.
SampleHook = tuple[str, Callable[..., Any], tuple[str, ...]]


def load_sample_hooks(paths: list[str] | None) -> list[SampleHook]:
    """Each path of the (repeatable) flag, imported and checked to take (args, sample)."""
    hooks = []
    for path in paths or []:
        fn = load_plugin(path, SAMPLE_HOOK_FLAG, params=2)
        hooks.append((path, fn, _keywords(fn)))
    return hooks


def _keywords(fn: Callable[..., Any]) -> tuple[str, ...]:
    params = inspect.signature(fn).parameters.values()
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params):
        return KEYWORDS
    return tuple(k for k in KEYWORDS if k in {p.name for p in params})


async def apply_sample_hooks(
    hooks: list[SampleHook], args: Any, sample: Sample, *, rollout_id: int | None, evaluation: bool
) -> Sample:
    """The sample after every hook: the one a hook returned, or the same one when it returned None."""
    offered = {"rollout_id": rollout_id, "evaluation": evaluation}
    for path, fn, keywords in hooks:
        result = fn(args, sample, **{k: offered[k] for k in keywords})
        if inspect.isawaitable(result):
            result = await result
        if result is None:
            continue
        if not isinstance(result, Sample):
            raise TypeError(f"{SAMPLE_HOOK_FLAG}={path!r} returned {type(result).__name__}: expected a Sample or None")
        sample = result
    return sample
