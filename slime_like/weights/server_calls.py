"""HTTP calls to SGLang servers around a weight update, each bounded in time with a clear error."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests

from rollout.sglang_server import flush_cache

__all__ = ["WeightUpdateError", "flush_cache", "on_all", "post"]


class WeightUpdateError(RuntimeError):
    """A weight update that did not complete on some server."""


def post(url: str, path: str, payload: dict[str, Any] | None = None, timeout: float = 300.0) -> dict[str, Any]:
    """POST and return the JSON answer; raise WeightUpdateError naming the server on failure."""
    try:
        resp = requests.post(f"{url}{path}", json=payload or {}, timeout=timeout)
    except requests.RequestException as exc:
        raise WeightUpdateError(f"{url}{path} failed: {exc!r}") from exc
    if resp.status_code != 200:
        raise WeightUpdateError(f"{url}{path} answered {resp.status_code}: {resp.text[:300]}")
    body = resp.json() if resp.content else {}
    if isinstance(body, dict) and body.get("success") is False:
        raise WeightUpdateError(f"{url}{path} reported failure: {body.get('message')}")
    return body


def on_all(urls: list[str], fn: Any, *args: Any) -> list[Any]:
    """Call fn(url, *args) for every server concurrently; re-raise the first error."""
    with ThreadPoolExecutor(max_workers=max(1, len(urls))) as pool:
        return [f.result() for f in [pool.submit(fn, url, *args) for url in urls]]
