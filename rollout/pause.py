"""Pausing SGLang generation for a weight update without draining it (--fully-async, --pause-generation-mode).

What each mode does to the requests in flight (measured on SGLang 0.5.15's CPU engine, tests/integration/
test_pause_modes.py):
- abort: they answer at once with their tokens so far (finish reason abort, the old weight version); the pause
  returns once all have. The caller continues them later as partial samples, on the new weights.
- retract: they go back to the engine's queue and their KV cache is freed; after the continue the engine computes
  it again (prompt and tokens so far) with the new weights and goes on. They answer once, at the end.
- in_place: they stay where they are with their KV cache of the old weights and go on from there after it.
Requests sent while paused wait in the server; /health hangs until the continue.

A request that spans an update then holds tokens of two versions; its answer is streamed (rollout.sglang_stream.
read_stream), which says the version of every token, only when this can happen (`streams_versions`): streaming
costs throughput. Two server settings make those versions and the new weights exact (`server_args`, checked by
`check_server_args`):
- --disable-radix-cache (retract, in_place): the engine refuses to flush its cache while it holds requests, so the
  prefix cache would keep serving prompt prefixes computed by older weights to every later request (measured: a
  prompt's prefix reused after an in_place update, its log-probs 3e-3 off the new weights'), for as long as the
  engine is never idle, which under --fully-async is the whole run.
- --disable-overlap-schedule (in_place): with SGLang's overlap scheduler the step computed just before the pause is
  only emitted after the continue, so each running request's next token would be labelled with the new version
  though the old weights made it (measured: one token per request).
- --incremental-streaming-output (retract, in_place): chunks carry only their new tokens; by default each chunk
  repeats the whole answer so far, which costs time quadratic in the response length.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rollout import sglang_client as client
from slime_like.core.errors import EngineError

logger = logging.getLogger(__name__)

PAUSE_MODES = client.PAUSE_MODES
# The modes that keep requests inside the engine across an update.
IN_ENGINE_MODES = ("retract", "in_place")
# SGLang server flags each mode needs (see the module docstring), and the /get_server_info field each one sets.
SERVER_ARGS = {
    "abort": (),
    "retract": ("--disable-radix-cache", "--incremental-streaming-output"),
    "in_place": ("--disable-radix-cache", "--disable-overlap-schedule", "--incremental-streaming-output"),
}
_INFO_FIELDS = {
    "--disable-radix-cache": "disable_radix_cache",
    "--disable-overlap-schedule": "disable_overlap_schedule",
    "--incremental-streaming-output": "incremental_streaming_output",
}


def streams_versions(args: Any) -> bool:
    """Whether a request may span a weight update (--fully-async with retract or in_place pauses), so that its
    answer must be streamed to learn which weights generated each token."""
    mode = getattr(args, "pause_generation_mode", "abort")
    return bool(getattr(args, "fully_async", False)) and mode in IN_ENGINE_MODES


def server_args(mode: str) -> list[str]:
    """The SGLang server flags pausing in `mode` needs (add them to every engine's launch)."""
    if mode not in SERVER_ARGS:
        raise ValueError(f"pause mode {mode!r} is not one of {', '.join(PAUSE_MODES)}")
    return list(SERVER_ARGS[mode])


def check_server_args(urls: list[str], mode: str, timeout: float = 10.0) -> None:
    """EngineError naming each server that runs without a flag `mode` needs, and how to add it."""
    problems = []
    for url in urls:
        info = client.get(url, "/get_server_info", timeout)
        missing = [flag for flag in server_args(mode) if not info.get(_INFO_FIELDS[flag])]
        if missing:
            problems.append(f"{url} runs without {' '.join(missing)}")
    if problems:
        needed = " ".join(f"--sglang-{flag[2:]}" for flag in server_args(mode))
        raise EngineError(
            f"--pause-generation-mode {mode} keeps requests in the engines across weight updates, which needs "
            f"SGLang flags these servers lack: {'; '.join(problems)}. Start them with {needed} (rollout/pause.py "
            "says why), or pause with abort."
        )


def pause_all(urls: list[str], mode: str, timeout: float = 60.0) -> None:
    """Pause generation on every server in `mode` (in parallel); EngineError naming the server that failed.
    Pausing a paused server again in the same mode changes nothing."""
    client.on_all(urls, lambda url: client.pause_generation(url, mode, timeout))


def continue_all(urls: list[str], timeout: float = 60.0) -> None:
    """Continue generation on every server, each tried even when another fails; then EngineError naming those
    that failed (a server left paused hangs every request sent to it)."""
    failed = []
    for url in urls:
        try:
            client.continue_generation(url, timeout)
        except EngineError as exc:
            failed.append(str(exc))
    if failed:
        raise EngineError("continuing generation failed: " + "; ".join(failed))


def flush_paused(urls: list[str], mode: str, attempts: int = 3) -> None:
    """Flush the KV caches of paused servers before new weights arrive.

    abort: the servers hold no request, so a refusal can only be one finishing: retried `attempts` times.
    retract, in_place: a server holding requests refuses (kept, by design: in_place continues on that cache, and
    retract recomputes it), so one try each, which empties an idle server's prefix cache.
    """
    if mode == "abort":
        client.on_all(urls, client.flush_cache, attempts)
        return
    for url in urls:
        try:
            client.post(url, "/flush_cache", timeout=10.0)
        except EngineError as exc:
            logger.debug("%s keeps its cache while it holds paused requests (%s)", url, exc)


@contextmanager
def paused(urls: list[str], mode: str, timeout: float = 60.0) -> Iterator[None]:
    """Generation paused on every server in `mode` inside the block, continued after it (also when it fails)."""
    pause_all(urls, mode, timeout)
    try:
        yield
    finally:
        continue_all(urls, timeout)
