"""The interface every weight-update transport implements, the update protocol they share, and bucketing.

`update` is the protocol around a transport's `send`: pause generation on every server (in-flight
requests are aborted and drained, new ones wait), flush the KV caches (they hold the old weights'
keys and values), send the weights, tag the new weight version, and let generation continue, also
when the update failed (a paused server would hang). Transports send with `flush_cache: false`: a
flush that races a request finishing can kill an SGLang server, so it is done here first, with retries.
Under --fully-async the pause takes --pause-generation-mode: with `retract` or `in_place` requests stay
in the engines, which refuse a flush while they hold any, so the caches are kept (one try empties an idle
engine's prefix cache); the weights load under the paused requests (rollout/pause.py).
"""

from __future__ import annotations

import abc
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future
from concurrent.futures import wait as wait_futures
from typing import Any

import torch

from rollout import pause
from rollout import sglang_client as client

logger = logging.getLogger(__name__)

NamedTensors = Iterable[tuple[str, torch.Tensor]]

# Fault tests: the dotted path of hook(phase, urls, version), called by rank 0 at each phase of an update (start,
# paused, flushed, sending: after the first tensor, sent, tagged) to kill an engine at a known point.
HOOK_ENV = "SLIME_LIKE_WEIGHT_UPDATE_HOOK"

# (target URLs) -> those the engine fleet has found dead; never blocks (weights/updater.py FleetWatch).
Watch = Callable[[list[str]], list[str]]
POLL_S = 1.0  # how often a wait inside an update asks the watch


def phase(name: str, urls: list[str], version: int) -> None:
    """Call the phase hook of HOOK_ENV, if one is set."""
    path = os.environ.get(HOOK_ENV)
    if path:
        from slime_like.core.plugin_loader import load_plugin

        load_plugin(path, HOOK_ENV)(name, list(urls), version)


def _announced(named_tensors: NamedTensors, urls: list[str], version: int) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors, with the "sending" phase announced once the first has been taken."""
    for i, item in enumerate(named_tensors):
        yield item
        if i == 0:
            phase("sending", urls, version)


class WeightTransport(abc.ABC):
    """Moves one full set of HF-named weights from trainer rank 0 into every SGLang server."""

    name = "transport"  # the --update-weight-transport value
    flush_cache = True  # whether an update flushes the servers' caches (weights/lora.py says why it need not)
    # Set by the updater with a fleet (--use-fault-tolerance): a wait inside the update ends as soon as it names a
    # target dead, instead of at the timeout (a server held by a broken broadcast answers nothing until then).
    watch: Watch | None = None

    def __init__(self, server_urls: list[str], bucket_bytes: int, timeout_s: float = 300.0) -> None:
        self.server_urls = list(server_urls)
        self.bucket_bytes = bucket_bytes
        self.timeout_s = timeout_s  # bounds every server call and broadcast

    def connect(self) -> None:  # noqa: B027 - optional hook
        """Prepare the channel to the servers (called before the first send, and again after a failure)."""

    @abc.abstractmethod
    def send(self, named_tensors: NamedTensors, version: int) -> None:
        """Push all tensors to every server (generation is paused and caches flushed around it)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the channel (best effort: a dead server cannot answer)."""

    def check_targets(self, what: str) -> None:
        """Raise EngineLostError when the watch names a target dead."""
        dead = self.watch(self.server_urls) if self.watch is not None else []
        if dead:
            raise EngineLostError(f"{', '.join(dead)} died {what} (the engine fleet's verdict)")

    def results(self, futures: list[Future], what: str) -> list[Any]:
        """The futures' results in order: the first error as soon as it comes, or EngineLostError as soon as the watch
        names a target dead while they run."""
        while True:
            _, pending = wait_futures(futures, timeout=POLL_S, return_when=FIRST_EXCEPTION)
            for future in futures:
                if future.done() and future.exception() is not None:
                    future.result()  # raises its error
            if not pending:
                return [f.result() for f in futures]
            self.check_targets(what)

    def wait_works(self, works: list[Any], what: str) -> None:
        """Wait for torch.distributed works (raising their error); with a watch, polled, so that a target found dead
        ends the wait at once."""
        if self.watch is None:
            for work in works:
                work.wait()
            return
        asked = time.monotonic()
        for work in works:
            while not work.is_completed():
                time.sleep(0.005)
                if time.monotonic() - asked >= POLL_S:
                    self.check_targets(what)
                    asked = time.monotonic()
            work.wait()  # its error, if it failed

    def update(self, named_tensors: NamedTensors, version: int, pause_mode: str = "abort") -> None:
        """Pause generation (`pause_mode`: SGLang's abort, retract or in_place), flush caches, send, tag `version`,
        continue generation (rollout/pause.py)."""
        if os.environ.get(HOOK_ENV):
            named_tensors = _announced(named_tensors, self.server_urls, version)
        self.around(self.server_urls, lambda: self.send(named_tensors, version), version, pause_mode)

    def around(self, urls: list[str], send: Callable[[], None], version: int, pause_mode: str) -> None:
        """The protocol on the servers `urls`, with `send()` as its sending step."""
        timeout = self.timeout_s
        phase("start", urls, version)
        try:  # continued below also when a pause failed: a server left paused hangs every request
            pause.pause_all(urls, pause_mode, timeout)
            phase("paused", urls, version)
            if self.flush_cache:
                pause.flush_paused(urls, pause_mode, max(3, int(timeout // 10)))
            phase("flushed", urls, version)
            send()
            phase("sent", urls, version)
            client.on_all(urls, client.set_weight_version, version, timeout)
            phase("tagged", urls, version)
        finally:
            try:
                pause.continue_all(urls, timeout)
            except Exception as exc:  # the update's own error (if any) is the one to report
                logger.warning("after a weight update: %r", exc)


class EngineLostError(RuntimeError):
    """An engine the update targets died meanwhile (the fleet's verdict): the wait for it ended early."""


def buckets(named_tensors: NamedTensors, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group tensors in order into lists of at most `bucket_bytes` (a larger tensor gets a bucket alone)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def flat_size(bucket: list[tuple[str, torch.Tensor]], align: int = 1) -> int:
    """Bytes a bucket takes flattened, each tensor starting at a multiple of `align`."""
    return sum(-(-t.numel() * t.element_size() // align) * align for _, t in bucket)


def flatten_into(
    bucket: list[tuple[str, torch.Tensor]], buffer: torch.Tensor, align: int = 1
) -> tuple[torch.Tensor, list[dict]]:
    """Copy a bucket's bytes in order into `buffer` (uint8); return the used part and each tensor's place.

    With align=1 the layout is SGLang's FlattenedTensorBucket (back to back), which a server rebuilds
    from names, dtypes and shapes alone; with metadata sent along, tensors may start aligned.
    """
    metadata = []
    offset = 0
    for name, tensor in bucket:
        offset = -(-offset // align) * align
        nbytes = tensor.numel() * tensor.element_size()
        target = buffer[offset : offset + nbytes]
        if offset % tensor.element_size() == 0:  # a typed view: copy_ reads non-contiguous sources directly
            target.view(tensor.dtype).view(tensor.shape).copy_(tensor)
        else:
            target.copy_(tensor.detach().contiguous().view(-1).view(torch.uint8))
        metadata.append(
            {
                "name": name,
                "shape": tensor.shape,
                "dtype": tensor.dtype,
                "start_idx": offset,
                "end_idx": offset + nbytes,
                "numel": nbytes,
            }  # fmt: skip
        )
        offset += nbytes
    return buffer[:offset], metadata
