"""A reward model served over HTTP (--rm-type remote --rm-url URL): retries with backoff, per-attempt timeout.

Request: POST URL with JSON {"prompt", "response", "label", "metadata", "index"}.
Answer: a number, {"reward": number or {name: number}}, or {name: number, ...} (a dict reward; see --reward-key).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

import aiohttp

from slime_like.core.sample import Sample

logger = logging.getLogger(__name__)


class RemoteRewardError(RuntimeError):
    """The reward server gave no usable answer."""


def parse_reward(body: Any) -> float | dict[str, float]:
    """A reward from the server's JSON answer."""
    if isinstance(body, dict) and "reward" in body:
        body = body["reward"]
    if isinstance(body, bool) or not isinstance(body, int | float | dict):
        raise RemoteRewardError(f"expected a number or a dict of numbers, got {str(body)[:200]}")
    if isinstance(body, dict):
        return {str(k): float(v) for k, v in body.items()}
    return float(body)


class RemoteRewardModel:
    """Async reward function `(args, sample) -> reward` backed by an HTTP service; counts retries and failures."""

    def __init__(self, url: str, timeout: float, retries: int, backoff: float = 0.5) -> None:
        self.url = url
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.counters: Counter[str] = Counter()
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _client(self) -> aiohttp.ClientSession:
        # A session belongs to one event loop; tests and tools may score from a fresh loop.
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
            self._loop = loop
        return self._session

    async def __call__(self, args: Any, sample: Sample) -> float | dict[str, float]:
        """Score one sample remotely; RemoteRewardError after every attempt failed."""
        payload = {
            "prompt": sample.prompt,
            "response": sample.response,
            "label": sample.label,
            "metadata": sample.metadata,
            "index": sample.index,
        }
        delay, error = self.backoff, ""
        for attempt in range(self.retries + 1):
            try:
                async with self._client().post(self.url, json=payload) as resp:
                    if resp.status == 200:
                        try:
                            return parse_reward(await resp.json(content_type=None))
                        except (RemoteRewardError, ValueError) as exc:
                            error = f"unusable answer: {exc}"
                            break  # the server answered, but not with a reward: retrying cannot help
                    error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                    if 400 <= resp.status < 500 and resp.status not in (408, 429):
                        break  # the request itself is wrong: retrying cannot help
            except (TimeoutError, aiohttp.ClientError) as exc:
                error = repr(exc)
            if attempt < self.retries:
                self.counters["rm_remote_retries"] += 1
                logger.warning(
                    "reward server %s: %s; retry %d/%d in %.1fs", self.url, error, attempt + 1, self.retries, delay
                )
                await asyncio.sleep(delay)
                delay *= 2
        self.counters["rm_remote_failures"] += 1
        raise RemoteRewardError(f"--rm-url {self.url}: no reward for sample {sample.index}; last error: {error}")

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None and not self._session.closed:
            await self._session.close()
