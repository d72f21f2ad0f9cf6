"""slime.rollout.filter_hub.base_types: a dynamic filter's verdict."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class DynamicFilterOutput:
    """keep or drop a group; reason names a drop; keep_when_insufficient keeps it when too few groups remain."""

    keep: bool
    reason: str | None = None
    keep_when_insufficient: bool = False


def call_dynamic_filter(fn: Callable[..., Any] | None, *args: Any, **kwargs: Any) -> DynamicFilterOutput:
    """Call a filter (None keeps everything); a plain bool is wrapped."""
    if fn is None:
        return DynamicFilterOutput(keep=True)
    out = fn(*args, **kwargs)
    return out if isinstance(out, DynamicFilterOutput) else DynamicFilterOutput(keep=bool(out))
