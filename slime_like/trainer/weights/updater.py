"""One weight update, run on every trainer rank: rank 0 sends, retries once, then falls back to disk.

The export of HF weights is a collective (TP/PP/EP gathers), so every rank iterates it on every attempt;
rank 0 also sends. After each attempt rank 0's outcome is broadcast, so all ranks retry, fall back or
stop together. A failure is logged in one line naming the version, the transport and the cause; when
every attempt failed the update raises WeightUpdateError with each cause. Nothing waits without a bound:
every server call and broadcast has a timeout.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch.distributed as dist

from slime_like.core.errors import WeightUpdateError
from slime_like.trainer.weights.base import NamedTensors, WeightTransport

logger = logging.getLogger(__name__)

# Failures of the channel (a dead or stalled server, a broken group): worth a retry or the fallback.
_RETRIABLE = (WeightUpdateError, RuntimeError, OSError, TimeoutError)


def _drain(named_tensors: Iterable) -> None:
    for _ in named_tensors:  # the export's gathers need every rank, whatever this one does with the tensors
        pass


def share_from_rank0(value: Any) -> Any:
    """Rank 0's value on every trainer rank (itself when there is one rank)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class WeightUpdater:
    """Runs weight updates with a primary transport, retries and a fallback, chosen by name."""

    def __init__(
        self,
        factories: dict[str, Callable[[], WeightTransport]],
        primary: str,
        fallback: str | None = "disk",
        retries: int = 1,
        rank: int = 0,
    ) -> None:
        self.factories = factories
        self.attempts = [primary] * (1 + retries)
        if fallback and fallback != primary:
            self.attempts.append(fallback)
        self.rank = rank
        self.transports: dict[str, WeightTransport] = {}
        self.version: int | None = None

    def update(self, export: Callable[[], NamedTensors], version: int, pause_mode: str = "abort") -> str:
        """Push the weights `export()` yields to every server as `version` (generation paused in `pause_mode`);
        return the transport that worked."""
        if self.version is not None and version <= self.version:
            raise ValueError(f"weight version {version} is not above the current one ({self.version})")
        causes = []
        for attempt, kind in enumerate(self.attempts):
            named = export()
            outcome = self._attempt(kind, named, version, pause_mode) if self.rank == 0 else _drain(named)
            outcome = share_from_rank0(outcome)
            if outcome is None:
                self.version = version
                if attempt:
                    logger.warning(
                        "weight update to version %d succeeded over %s after %d failure(s)", version, kind, attempt
                    )
                return kind
            cause, retriable = outcome
            causes.append(f"{kind}: {cause}")
            following = self.attempts[attempt + 1] if retriable and attempt + 1 < len(self.attempts) else None
            then = (
                "giving up"
                if following is None
                else ("retrying" if following == kind else f"falling back to {following}")
            )
            logger.error(
                "weight update to version %d over %s failed (attempt %d of %d): %s; %s",
                version, kind, attempt + 1, len(self.attempts), cause, then,
            )  # fmt: skip
            if following is None:
                break
        raise WeightUpdateError(f"weight update to version {version} failed: " + " | ".join(causes))

    def _attempt(self, kind: str, named: NamedTensors, version: int, pause_mode: str) -> tuple[str, bool] | None:
        """Rank 0's try: None on success, else (cause, whether another attempt makes sense)."""
        try:
            transport = self.transports.get(kind) or self.factories[kind]()
            self.transports[kind] = transport
            transport.update(named, version, pause_mode)
            return None
        except Exception as exc:
            self._reset(kind)
            return f"{type(exc).__name__}: {exc}", isinstance(exc, _RETRIABLE)
        finally:
            _drain(named)  # a send that stopped part-way leaves the rest of the export to finish

    def _reset(self, kind: str) -> None:
        """Drop a transport after a failure; the next attempt builds and connects a fresh one."""
        transport = self.transports.pop(kind, None)
        if transport is not None:
            try:
                transport.close()
            except Exception as exc:
                logger.warning("closing the %s transport after a failure: %r", kind, exc)

    def close(self) -> None:
        """Release every transport."""
        for kind in list(self.transports):
            self._reset(kind)
