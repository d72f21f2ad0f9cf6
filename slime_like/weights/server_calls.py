"""HTTP calls to SGLang servers around a weight update, each bounded in time with a clear error."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests

from rollout.sglang_server import flush_cache as _flush_cache

__all__ = [
    "WeightUpdateError",
    "continue_generation",
    "flush_cache",
    "on_all",
    "pause_generation",
    "post",
    "set_weight_version",
    "weight_version",
]


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
    try:
        body = resp.json() if resp.content else {}
    except ValueError:
        body = {}
    if isinstance(body, dict) and body.get("success") is False:
        raise WeightUpdateError(f"{url}{path} reported failure: {body.get('message')}")
    return body


def on_all(urls: list[str], fn: Any, *args: Any) -> list[Any]:
    """Call fn(url, *args) for every server concurrently; re-raise the first error."""
    with ThreadPoolExecutor(max_workers=max(1, len(urls))) as pool:
        return [f.result() for f in [pool.submit(fn, url, *args) for url in urls]]


def flush_cache(url: str, attempts: int = 30) -> None:
    """POST /flush_cache until it answers 200 (it refuses while requests run); WeightUpdateError after `attempts`
    (about a second and at most ten each)."""
    try:
        _flush_cache(url, attempts=attempts)
    except RuntimeError as exc:
        raise WeightUpdateError(str(exc)) from exc


def pause_generation(url: str, timeout: float = 60.0) -> None:
    """Stop generation and drain: in-flight requests are aborted (they return what they have), new ones wait."""
    post(url, "/pause_generation", {"mode": "abort"}, timeout)


def continue_generation(url: str, timeout: float = 60.0) -> None:
    """Let waiting and new requests run again (a paused server also hangs /health)."""
    post(url, "/continue_generation", {}, timeout)


def set_weight_version(url: str, version: int, timeout: float = 60.0) -> None:
    """Tag the server's weights (returned with every sample as its weight version)."""
    post(url, "/update_weight_version", {"new_version": str(version), "abort_all_requests": False}, timeout)


def weight_version(url: str, timeout: float = 10.0) -> str:
    """The server's current weight version."""
    try:
        return requests.get(f"{url}/model_info", timeout=timeout).json()["weight_version"]
    except (requests.RequestException, ValueError, KeyError) as exc:
        raise WeightUpdateError(f"{url}/model_info failed: {exc!r}") from exc
