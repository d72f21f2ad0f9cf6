"""One weight update, run on every trainer rank: rank 0 sends, retries once, then falls back to disk.

The export of HF weights is a collective (TP/PP/EP gathers), so every rank iterates it on every attempt;
rank 0 also sends. After each attempt rank 0's outcome is broadcast, so all ranks retry, fall back or
stop together. A failure is logged in one line naming the version, the transport and the cause; when
every attempt failed the update raises WeightUpdateError with each cause. Nothing waits without a bound:
every server call and broadcast has a timeout.

With a fleet (--use-fault-tolerance) an engine that dies around the update is not the update's failure: after a
failed attempt rank 0 asks the fleet for its verdict on the engines the update targets (rollout/fleet.py `verdict`:
the dead ones are taken out of the router and restart before the next update, out of service until an update gives
them the weights). When it took any out, the same attempt runs again on those left, without using up a retry; the
update fails only when none is left, saying so. While an attempt waits (a broadcast, a server's answer) it polls the
fleet's verdict (FleetWatch), so that an engine that died mid-send ends the wait at once instead of at the timeout.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from typing import Any

import torch.distributed as dist

from slime_like.core.errors import WeightUpdateError
from slime_like.trainer.weights.base import NamedTensors, WeightTransport

logger = logging.getLogger(__name__)

Verdict = Callable[[list[str], str], list[str]]  # (target URLs, the failure) -> the URLs the fleet counts alive

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


class FleetWatch:
    """The fleet's verdict polled without blocking while an update waits (weights/base.py Watch): each call reads the
    answer to the last question, if it came, and asks again; the URLs the fleet found dead (and took out)."""

    def __init__(self, fleet: Any) -> None:
        self.fleet = fleet
        self._asked: tuple[Any, list[str]] | None = None  # (the pending answer, the URLs asked about)

    def __call__(self, urls: list[str]) -> list[str]:
        import ray

        if self._asked is not None:
            answer, asked = self._asked
            if not ray.wait([answer], timeout=0)[0]:
                return []
            self._asked = None
            try:
                alive = set(ray.get(answer))
            except Exception as exc:  # no verdict: the wait goes on, bounded by its timeout
                logger.warning("asking the engine fleet during the weight update: %r", exc)
                alive = set(asked)
            dead = [url for url in asked if url not in alive]
            if dead:
                return dead
        cause = "it stopped answering while the update waited for it"
        self._asked = (self.fleet.engine_verdict.remote(list(urls), cause), list(urls))
        return []


class FleetVerdict:
    """The verdict of the rollout manager `fleet` (a Ray actor handle), whose engine checks take up to `timeout` s;
    `watch` polls it without blocking."""

    def __init__(self, fleet: Any, timeout: float) -> None:
        self.fleet, self.timeout = fleet, timeout
        self.watch = FleetWatch(fleet)

    def __call__(self, urls: list[str], cause: str) -> list[str]:
        import ray

        return ray.get(self.fleet.engine_verdict.remote(urls, cause), timeout=self.timeout + 60)


def ask_fleet(fleet: Any, timeout: float) -> Verdict:
    """The verdict of the rollout manager `fleet` (a Ray actor handle), whose engine checks take up to `timeout` s."""
    return FleetVerdict(fleet, timeout)


class WeightUpdater:
    """Runs weight updates with a primary transport, retries and a fallback, chosen by name."""

    def __init__(
        self,
        factories: dict[str, Callable[[], WeightTransport]],
        primary: str,
        fallback: str | None = "disk",
        retries: int = 1,
        rank: int = 0,
        fleet: Verdict | None = None,
        in_place: Collection[str] = (),
    ) -> None:
        self.factories = factories
        # The transports whose engines keep what an update does not send (not those writing a whole checkpoint).
        self.in_place = frozenset(in_place)
        self.fleet = fleet
        self.urls: list[str] | None = None  # the engines still targeted after the fleet took some out
        self.attempts = [primary] * (1 + retries)
        if fallback and fallback != primary:
            self.attempts.append(fallback)
        self.rank = rank
        self.transports: dict[str, WeightTransport] = {}
        self.version: int | None = None

    def update(
        self,
        export: Callable[[], NamedTensors],
        version: int,
        pause_mode: str = "abort",
        export_in_place: Callable[[], NamedTensors] | None = None,
    ) -> str:
        """Push the weights `export()` yields to every server as `version` (generation paused in `pause_mode`), or
        over an in-place transport those of `export_in_place()` (the changed ones); return the transport that worked."""
        if self.version is not None and version <= self.version:
            raise ValueError(f"weight version {version} is not above the current one ({self.version})")
        causes = []
        attempt = 0
        while attempt < len(self.attempts):
            kind = self.attempts[attempt]
            named = (export_in_place if export_in_place is not None and kind in self.in_place else export)()
            outcome = self._attempt(kind, named, version, pause_mode) if self.rank == 0 else _drain(named)
            outcome = share_from_rank0(outcome)
            if outcome is not None and outcome[2] is not None:  # the fleet took engines out: again on those left
                self._engines_lost(version, kind, outcome[0], outcome[2])
                continue
            if outcome is None:
                self.version = version
                if attempt:
                    logger.warning(
                        "weight update to version %d succeeded over %s after %d failure(s)", version, kind, attempt
                    )
                return kind
            cause, retriable, _ = outcome
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
            attempt += 1
        raise WeightUpdateError(f"weight update to version {version} failed: " + " | ".join(causes))

    def _attempt(
        self, kind: str, named: NamedTensors, version: int, pause_mode: str
    ) -> tuple[str, bool, tuple[list[str], list[str]] | None] | None:
        """Rank 0's try: None on success, else (cause, whether another attempt makes sense, the URLs left and those
        taken out when the fleet took engines out)."""
        try:
            transport = self.transports.get(kind)
            if transport is None:
                transport = self.factories[kind]()
                if self.urls is not None:  # read at connect and send: the transport serves the engines left
                    transport.server_urls = list(self.urls)
            self.transports[kind] = transport
            transport.watch = getattr(self.fleet, "watch", None)  # polled while it waits: a death ends the wait
            transport.update(named, version, pause_mode)
            return None
        except Exception as exc:
            targets = list(self.transports[kind].server_urls) if kind in self.transports else self.urls
            self._reset(kind)
            cause = f"{type(exc).__name__}: {exc}"
            return cause, isinstance(exc, _RETRIABLE), self._verdict(targets, cause)
        finally:
            _drain(named)  # a send that stopped part-way leaves the rest of the export to finish

    def _verdict(self, targets: list[str] | None, cause: str) -> tuple[list[str], list[str]] | None:
        """(The engines of `targets` the fleet still counts alive, those it took out), or None when it took none out
        (or has no say)."""
        if self.fleet is None or targets is None:
            return None
        try:
            alive = set(self.fleet(targets, cause))
        except Exception as exc:  # the fleet did not answer: the attempt counts as the transport's failure
            logger.warning("asking the engine fleet about the failed weight update: %r", exc)
            return None
        lost = [url for url in targets if url not in alive]
        return ([url for url in targets if url in alive], lost) if lost else None

    def _engines_lost(self, version: int, kind: str, cause: str, verdict: tuple[list[str], list[str]]) -> None:
        """The fleet took engines out: target the rest, or raise when none is left."""
        live, lost = verdict
        self.urls = list(live)
        for transport in list(self.transports):
            self._reset(transport)
        if not live:
            raise WeightUpdateError(
                f"weight update to version {version} failed: no engine of the policy is left (the last failed "
                f"over {kind}: {cause})"
            )
        logger.warning(
            "weight update to version %d over %s: the engine fleet took out %s after %s; sending to the %d left",
            version, kind, ", ".join(lost), cause, len(live),
        )  # fmt: skip

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
