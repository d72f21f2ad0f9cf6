"""Every HTTP call to SGLang servers and sglang-router: the one module that knows their endpoints and payloads.

Blocking calls (start-up, weight updates, checks) use `requests`, are bounded by a timeout and raise
EngineError naming the URL; the calls a rollout makes while it generates are `async` and take its
aiohttp session. Router worker management follows sglang-router 0.3.2: GET /workers ->
{"workers": [{"id", "url", "is_healthy", ...}]}, POST /workers {"url"} -> 202 with a "worker_id" (the
worker is listed once its health check passed), DELETE /workers/{id} -> 202.

Every call carries the run's secret (`Authorization: Bearer`, slime_like.core.secret): servers and the router are
started with it and answer 401 to a request without it (only /health is open).
"""

from __future__ import annotations

import http.client
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import requests

from rollout.sglang_stream import GenerateRefused, OnIds, read_stream
from slime_like.core.errors import EngineError
from slime_like.core.secret import API_KEY_ENV, auth_headers

logger = logging.getLogger(__name__)

# SGLang's /pause_generation modes (what happens to in-flight requests: see pause_generation).
PAUSE_MODES = ("abort", "retract", "in_place")
# The name under which a LoRA run's servers hold the policy's adapter; every /generate of the run names it.
LORA_ADAPTER_NAME = "policy"
# Multi-LoRA (--multi-lora-adapter): the sample metadata key naming the adapter a sample is generated and trained with.
LORA_ADAPTER_KEY = "lora_adapter"


# --- blocking calls -------------------------------------------------------------------------------


def _answer(resp: requests.Response, where: str) -> Any:
    """The JSON body of a 200 answer ({} when empty); EngineError for any other status or a reported failure."""
    if resp.status_code != 200:
        raise EngineError(f"{where} answered HTTP {resp.status_code}: {resp.text[:300]}{_auth_hint(resp.status_code)}")
    try:
        body = resp.json() if resp.content else {}
    except ValueError:
        body = {}
    if isinstance(body, dict) and body.get("success") is False:
        raise EngineError(f"{where} reported failure: {body.get('message')}")
    return body


def _auth_hint(status: int) -> str:
    """What a 401/403 means here: the server wants the run's secret and this process sent none or another one."""
    if status not in (401, 403):
        return ""
    return f" (the server requires this run's secret: is {API_KEY_ENV} in this process's environment the run's?)"


def post(
    url: str, path: str, payload: dict[str, Any] | None = None, timeout: float = 300.0, api_key: str | None = None
) -> Any:
    """POST JSON and return the JSON answer (with `api_key`, else this process's run secret); raise EngineError
    naming the server on failure."""
    try:
        resp = requests.post(f"{url}{path}", json=payload or {}, headers=auth_headers(api_key), timeout=timeout)
    except requests.RequestException as exc:
        raise EngineError(f"{url}{path} failed: {exc!r}") from exc
    return _answer(resp, f"{url}{path}")


def get(url: str, path: str, timeout: float = 10.0) -> Any:
    """GET and return the JSON answer; raise EngineError naming the server on failure."""
    try:
        resp = requests.get(f"{url}{path}", headers=auth_headers(), timeout=timeout)
    except requests.RequestException as exc:
        raise EngineError(f"{url}{path} failed: {exc!r}") from exc
    return _answer(resp, f"{url}{path}")


def health_problem(url: str, timeout: float = 10.0) -> str | None:
    """Why GET /health fails (the connection error or the status), None when it answers 200; /health needs no key."""
    try:
        resp = requests.get(f"{url}/health", timeout=timeout)
    except requests.RequestException as exc:
        return f"{exc.__class__.__name__}: {exc}"
    return None if resp.status_code == 200 else f"HTTP {resp.status_code}"


def health_generate(url: str, timeout: float) -> None:
    """GET /health_generate: the server generates a token (or is already generating); EngineError if it does not
    answer 200 within `timeout`."""
    get(url, "/health_generate", timeout=timeout)


def on_all(urls: list[str], fn: Callable[..., Any], *args: Any) -> list[Any]:
    """Call fn(url, *args) for every server concurrently; re-raise the first error."""
    if len(urls) == 1:  # no thread pool for one server (starting one costs more than a short request)
        return [fn(urls[0], *args)]
    with ThreadPoolExecutor(max_workers=max(1, len(urls))) as pool:
        return [f.result() for f in [pool.submit(fn, url, *args) for url in urls]]


def generate(
    url: str,
    input_ids: list[int],
    sampling_params: dict[str, Any] | None = None,
    return_logprob: bool = False,
    timeout: float = 120.0,
    **fields: Any,
) -> dict[str, Any]:
    """POST /generate for one token-id prompt and return the JSON answer (text, output_ids, meta_info)."""
    payload = {"input_ids": input_ids, "sampling_params": sampling_params or {}, "return_logprob": return_logprob}
    return post(url, "/generate", {**payload, **fields}, timeout)


def prompt_logprobs(
    url: str,
    tokens: list[int],
    timeout: float = 60.0,
    lora_path: str | None = None,
    image_data: list[str] | None = None,
) -> list[float]:
    """The server's log-prob of every token of `tokens` after the first (its prompt log-probs), under the LoRA
    adapter named `lora_path` when given; `image_data`: the images of the tokens' image pads (a VL model's)."""
    fields: dict[str, Any] = {"lora_path": lora_path} if lora_path else {}
    if image_data:
        fields["image_data"] = image_data
    params = {"max_new_tokens": 1, "temperature": 0}
    out = generate(url, tokens, params, True, timeout, logprob_start_len=0, **fields)
    try:
        return [float(lp) for lp, _, _ in out["meta_info"]["input_token_logprobs"][1:]]
    except (KeyError, TypeError, ValueError) as exc:
        raise EngineError(f"{url}/generate gave no prompt log-probs: {exc!r}") from exc


def served_dtype(url: str, timeout: float = 10.0) -> str:
    """The precision the server runs its model at (from /get_server_info), or "unknown"."""
    try:
        return str(get(url, "/get_server_info", timeout).get("dtype", "unknown"))
    except (EngineError, AttributeError):
        return "unknown"


def freeze_gc(url: str, timeout: float = 30.0, api_key: str | None = None) -> bool:
    """Move every object the server made while starting out of Python's GC (SGLang's /freeze_gc).

    Every /flush_cache (each weight update) runs a full gc.collect() in the scheduler on CPU; over the
    start-up heap it takes ~0.33 s, after the freeze ~0.004 s. Those objects live as long as the server,
    so the collector has nothing to gain from walking them. A server without the endpoint still works. `api_key`:
    the server's key when it is not this process's run secret (an SGLangServer given its own).
    """
    try:
        post(url, "/freeze_gc", timeout=timeout, api_key=api_key)
    except EngineError as exc:
        logger.warning("SGLang at %s: /freeze_gc failed (%s); every cache flush will run a full GC", url, exc)
        return False
    return True


def flush_cache(url: str, attempts: int = 30, interval: float = 1.0, timeout: float = 10.0) -> None:
    """POST /flush_cache until it answers 200 (it refuses while requests are in flight); raise after `attempts`."""
    last = "no answer"
    for _ in range(attempts):
        try:
            post(url, "/flush_cache", timeout=timeout)
            return
        except EngineError as exc:
            last = str(exc)
        time.sleep(interval)
    raise EngineError(f"{url}/flush_cache did not answer 200 after {attempts} attempts; last answer: {last}")


def pause_generation(url: str, mode: str = "abort", timeout: float = 60.0) -> None:
    """POST /pause_generation; new requests wait until /continue_generation. In-flight requests, by `mode`:
    abort: answer with their tokens so far (finish reason abort) before this returns; retract: go back to the
    engine's queue, their KV cache freed (recomputed on continue); in_place: stay, with their KV cache."""
    if mode not in PAUSE_MODES:
        raise ValueError(f"pause mode {mode!r} is not one of {', '.join(PAUSE_MODES)}")
    post(url, "/pause_generation", {"mode": mode}, timeout)


def continue_generation(url: str, timeout: float = 60.0) -> None:
    """POST /continue_generation: paused and waiting requests run again (a paused server also hangs /health)."""
    post(url, "/continue_generation", {}, timeout)


def set_weight_version(url: str, version: int | str, timeout: float = 60.0) -> None:
    """Tag the server's weights (returned with every sample as its weight version)."""
    post(url, "/update_weight_version", {"new_version": str(version), "abort_all_requests": False}, timeout)


def weight_version(url: str, timeout: float = 10.0) -> str:
    """The server's current weight version."""
    info = get(url, "/model_info", timeout)
    if not isinstance(info, dict) or "weight_version" not in info:
        raise EngineError(f"{url}/model_info has no weight_version: {str(info)[:200]}")
    return info["weight_version"]


def lora_adapters(url: str, timeout: float = 10.0) -> dict[str, str]:
    """The LoRA adapters the server holds, name -> path (/v1/models lists them beside the base model)."""
    cards = get(url, "/v1/models", timeout).get("data", [])
    return {card["id"]: card.get("root") for card in cards if card.get("parent")}


def load_lora_adapter(url: str, name: str, path: str, timeout: float = 300.0) -> None:
    """Load the HF PEFT adapter in directory `path` (readable by the server) under `name`."""
    answer = post(url, "/load_lora_adapter", {"lora_name": name, "lora_path": path}, timeout)
    if isinstance(answer, dict) and answer.get("success") is False:
        raise EngineError(f"{url}/load_lora_adapter {path}: {answer.get('error_message')}")


def load_lora_adapter_from_tensors(
    url: str, name: str, config: dict[str, Any], serialized: str, timeout: float = 300.0
) -> None:
    """Load an adapter under `name` from shared-memory tensor handles (one flattened bucket, as serialized by
    slime_like.trainer.weights.tensor.serialize_bucket) and its adapter_config.json as a dict; same node only."""
    payload = {"lora_name": name, "config_dict": config, "serialized_tensors": serialized}
    answer = post(url, "/load_lora_adapter_from_tensors", {**payload, "load_format": "flattened_bucket"}, timeout)
    if isinstance(answer, dict) and answer.get("success") is False:
        raise EngineError(f"{url}/load_lora_adapter_from_tensors {name}: {answer.get('error_message')}")


class KeptAlive:
    """One server's HTTP connection, kept open between calls, for a request made at every step (a LoRA update):
    `requests` costs ~0.6 ms more per call than http.client and opens a new connection each time (measured on
    loopback). Used by one thread at a time. Only for idempotent requests: a kept connection the server closed
    meanwhile fails the next request, which is then sent once more on a new connection."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.url = url
        self._kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        self._address = (parts.hostname or "127.0.0.1", parts.port)
        self._conn: http.client.HTTPConnection | None = None

    def post(self, path: str, payload: dict[str, Any], timeout: float) -> tuple[int, Any]:
        """POST JSON; the status and the JSON answer ({} when empty or not JSON). EngineError when it fails."""
        body = json.dumps(payload)
        headers = {"Content-Type": "application/json", **auth_headers()}
        for fresh in (self._conn is None, True):
            try:
                if self._conn is None:
                    self._conn = self._kind(*self._address, timeout=timeout)
                elif self._conn.sock is not None:
                    self._conn.sock.settimeout(timeout)
                self._conn.request("POST", path, body, headers)
                resp = self._conn.getresponse()
                data = resp.read()
            except (TimeoutError, OSError, http.client.HTTPException) as exc:
                self.close()
                if fresh or isinstance(exc, TimeoutError):
                    raise EngineError(f"{self.url}{path} failed: {exc!r}") from exc
                continue  # the server closed the kept connection: once more on a new one
            try:
                return resp.status, json.loads(data) if data else {}
            except ValueError:
                return resp.status, {"text": data[:300].decode(errors="replace")}
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close the connection (the next call opens a new one)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


# rollout/sglang_launch.py's endpoint: a whole LoRA weight update in one request.
LORA_SWAP_PATH = "/slime_like/swap_lora_adapters"


def swap_lora_adapters(
    server: KeptAlive, adapters: list[dict[str, Any]], version: int | str, pause_mode: str = "abort",
    timeout: float = 300.0,
) -> dict[str, float] | None:  # fmt: skip
    """Pause generation, swap in each adapter (unloading the one of its name), tag `version` and continue, in one
    request (servers started through rollout.sglang_launch); the server's seconds per step, or None when the server
    has no such endpoint (then use pause_generation, unload/load and set_weight_version). The request is
    idempotent: sent twice, the second swaps the same adapters in again.

    Each adapter is {"lora_name", "lora_path"} (a PEFT directory the server reads) or {"lora_name", "config_dict",
    "serialized_tensors", "load_format"} (shared-memory handles, as load_lora_adapter_from_tensors sends them)."""
    payload = {"adapters": adapters, "weight_version": str(version), "pause_mode": pause_mode}
    status, answer = server.post(LORA_SWAP_PATH, payload, timeout)
    where = f"{server.url}{LORA_SWAP_PATH}"
    if status == 404 and answer == {"detail": "Not Found"}:  # FastAPI's answer for a route it does not have
        return None
    if status != 200 or not isinstance(answer, dict) or answer.get("success") is False:
        message = (answer.get("message") or answer.get("text") or answer) if isinstance(answer, dict) else answer
        raise EngineError(f"{where} answered HTTP {status}: {str(message)[:500]}{_auth_hint(status)}")
    return answer.get("timings", {})


def unload_lora_adapter(url: str, name: str, timeout: float = 300.0, held: bool = False) -> None:
    """Unload the adapter `name`: nothing to do when the server does not hold it; `held=True` (the caller loaded
    it) skips asking the server (/v1/models) first."""
    if held or name in lora_adapters(url, min(timeout, 30.0)):
        post(url, "/unload_lora_adapter", {"lora_name": name}, timeout)


def release_memory(url: str, timeout: float = 300.0) -> None:
    """Free the server's weights and KV cache (GPU only; on CPU it answers 200 and frees nothing)."""
    post(url, "/release_memory_occupation", {}, timeout)


def resume_memory(url: str, timeout: float = 300.0) -> None:
    """Take the memory back before weights are updated and generation resumes."""
    post(url, "/resume_memory_occupation", {}, timeout)


def update_weights_from_disk(url: str, model_path: str, version: int | str, timeout: float = 600.0) -> None:
    """Reload the weights from an HF checkpoint directory the server can read (no cache flush)."""
    payload = {"model_path": model_path, "weight_version": str(version), "flush_cache": False}
    post(url, "/update_weights_from_disk", payload, timeout)


def update_weights_from_tensor(
    url: str, serialized: list[Any], load_format: str | None, timeout: float = 300.0
) -> None:
    """Load tensors from shared-memory handles, one serialised list per TP rank of the server (no cache flush)."""
    payload = {"serialized_named_tensors": serialized, "load_format": load_format, "flush_cache": False}
    post(url, "/update_weights_from_tensor", payload, timeout)


def init_weights_update_group(
    url: str,
    master_address: str,
    master_port: int,
    rank_offset: int,
    world_size: int,
    group_name: str,
    backend: str,
    timeout: float = 300.0,
) -> None:
    """Make the server's ranks join the trainer's weight-broadcast group (blocks until the group forms)."""
    payload = {
        "master_address": master_address,
        "master_port": master_port,
        "rank_offset": rank_offset,
        "world_size": world_size,
        "group_name": group_name,
        "backend": backend,
    }
    post(url, "/init_weights_update_group", payload, timeout)


def update_weights_from_distributed(
    url: str, names: list[str], dtypes: list[str], shapes: list[list[int]], group_name: str, timeout: float = 300.0
) -> None:
    """Announce one bucket; the server receives its tensors from the trainer's broadcasts (no cache flush)."""
    payload = {"names": names, "dtypes": dtypes, "shapes": shapes, "group_name": group_name, "flush_cache": False}
    post(url, "/update_weights_from_distributed", payload, timeout)


def destroy_weights_update_group(url: str, group_name: str, timeout: float = 300.0) -> None:
    """Leave the weight-broadcast group."""
    post(url, "/destroy_weights_update_group", {"group_name": group_name}, timeout)


# --- sglang-router worker management ---------------------------------------------------------------


def list_workers(router_url: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The router's workers as it reports them (each with id, url, is_healthy, load, ...)."""
    return get(router_url, "/workers", timeout)["workers"]


def add_worker(router_url: str, worker_url: str, timeout: float = 10.0) -> str | None:
    """Ask the router to register a worker (asynchronous: it is listed once healthy); its worker id."""
    try:
        resp = requests.post(f"{router_url}/workers", json={"url": worker_url}, headers=auth_headers(), timeout=timeout)
    except requests.RequestException as exc:
        raise EngineError(f"router {router_url}: adding worker {worker_url} failed: {exc!r}") from exc
    if resp.status_code not in (200, 202):
        raise EngineError(
            f"router {router_url} refused to add worker {worker_url}: HTTP {resp.status_code} {resp.text}"
            f"{_auth_hint(resp.status_code)}"
        )
    return resp.json().get("worker_id")


def delete_worker(router_url: str, worker_id: str, timeout: float = 10.0) -> None:
    """Ask the router to deregister a worker by id (asynchronous: it disappears shortly after)."""
    try:
        resp = requests.delete(f"{router_url}/workers/{worker_id}", headers=auth_headers(), timeout=timeout)
    except requests.RequestException as exc:
        raise EngineError(f"router {router_url}: removing worker {worker_id} failed: {exc!r}") from exc
    if resp.status_code not in (200, 202, 204):
        raise EngineError(
            f"router {router_url} refused to remove {worker_id}: HTTP {resp.status_code} {resp.text}"
            f"{_auth_hint(resp.status_code)}"
        )


def worker_job_status(router_url: str, worker_id: str, timeout: float = 5.0) -> Any:
    """The router's background job status of a pending worker, or None when it has none."""
    try:
        return get(router_url, f"/workers/{worker_id}", timeout).get("job_status")
    except (EngineError, AttributeError):
        return None


# --- calls a rollout makes while it generates (aiohttp) ------------------------------------------------


async def generate_async(
    session: aiohttp.ClientSession, url: str, payload: dict[str, Any], on_ids: OnIds | None = None
) -> dict[str, Any]:
    """POST /generate; GenerateRefused on a 4xx answer, EngineError on a 5xx answer or a broken connection.

    With `"stream": true` in the payload the answer is read chunk by chunk and returned whole, as without it, plus
    `meta_info["weight_version_spans"]` (see `read_stream`); `on_ids` is then awaited with each chunk's new ids.
    """
    try:
        async with session.post(f"{url}/generate", json=payload, headers=auth_headers()) as resp:
            if resp.status == 200:
                if payload.get("stream"):
                    return await read_stream(resp.content.iter_any(), f"{url}/generate", on_ids)
                return await resp.json(content_type=None)
            error = f"/generate answered {resp.status}: {(await resp.text())[:300]}{_auth_hint(resp.status)}"
    except (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
        raise EngineError(f"/generate failed: {exc!r}") from exc
    raise (GenerateRefused if resp.status < 500 else EngineError)(error)


async def embeddings_async(
    session: aiohttp.ClientSession, url: str, inputs: list[list[int]], model: str
) -> list[list[float]]:
    """POST /v1/embeddings for token-id inputs (a reward model's scores, served with --is-embedding), in input order;
    GenerateRefused on a 4xx answer, EngineError on a 5xx answer, a broken connection or an answer without them.

    sglang-router 0.3.2 passes this on but not SGLang's native /classify (404)."""
    try:
        async with session.post(
            f"{url}/v1/embeddings", json={"input": inputs, "model": model}, headers=auth_headers()
        ) as resp:
            if resp.status == 200:
                answer = await resp.json(content_type=None)
                try:
                    return [row["embedding"] for row in sorted(answer["data"], key=lambda row: row["index"])]
                except (KeyError, TypeError) as exc:
                    raise EngineError(f"{url}/v1/embeddings gave no embeddings ({exc!r}): {str(answer)[:300]}") from exc
            error = f"/v1/embeddings answered {resp.status}: {(await resp.text())[:300]}{_auth_hint(resp.status)}"
    except (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
        raise EngineError(f"/v1/embeddings failed: {exc!r}") from exc
    raise (GenerateRefused if resp.status < 500 else EngineError)(error)


async def abort_request(session: aiohttp.ClientSession, url: str, rid: str | None = None) -> None:
    """POST /abort_request for one request id, or for every request with rid None; EngineError on failure."""
    payload = {"rid": rid} if rid is not None else {"abort_all": True}
    try:
        async with session.post(f"{url}/abort_request", json=payload, headers=auth_headers()) as resp:
            text = await resp.text()
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise EngineError(f"{url}/abort_request failed: {exc!r}") from exc
    if resp.status != 200:
        raise EngineError(f"{url}/abort_request answered {resp.status}: {text[:200]}{_auth_hint(resp.status)}")
