"""A server and a router started with the run's secret refuse every request without it (measured: 401), serve
the ones that carry it, and the router passes it on to its workers. One keyed server and router per module."""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import psutil
import pytest
import requests

from rollout import sglang_client as client
from rollout.router import SGLangRouter
from rollout.sglang_server import SGLangServer
from slime_like.core.errors import EngineError
from slime_like.core.secret import API_KEY_ENV

# A user-set key may start with `-` (a flag to a naive launcher): this one does, so both launchers are tested on it.
KEY = "-" + secrets.token_urlsafe(32)
GENERATE = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2, "temperature": 0}}


@pytest.fixture(scope="module")
def keyed(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SGLangServer, SGLangRouter]]:
    """A server and a round-robin router in front of it, both with KEY; this process's client sends KEY."""
    saved = os.environ.get(API_KEY_ENV)
    os.environ[API_KEY_ENV] = KEY  # the client (and the router's readiness polls) send it, as in a run
    logs = tmp_path_factory.mktemp("keyed")
    server = SGLangServer(tiny_qwen3, dtype="float32", log_dir=logs, startup_timeout=180)
    try:
        with server, SGLangRouter([server.url], policy="round_robin", log_dir=logs) as router:
            yield server, router
    finally:
        if saved is None:
            os.environ.pop(API_KEY_ENV, None)
        else:
            os.environ[API_KEY_ENV] = saved


def _status(url: str, path: str, key: str | None, payload: dict | None = None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.post(f"{url}{path}", json=payload or {}, headers=headers, timeout=30).status_code


@pytest.mark.parametrize(
    ("path", "payload"),
    [
        ("/generate", GENERATE),
        ("/update_weights_from_disk", {"model_path": "/nonexistent"}),
        ("/update_weights_from_tensor", {"serialized_named_tensors": ["AA=="], "flush_cache": False}),
        ("/init_weights_update_group", {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1,
                                        "world_size": 2, "group_name": "x", "backend": "gloo"}),
        ("/update_weight_version", {"new_version": "9"}),
        ("/flush_cache", {}),
        ("/abort_request", {"abort_all": True}),
    ],
)  # fmt: skip
def test_the_server_refuses_requests_without_the_secret(
    keyed: tuple[SGLangServer, SGLangRouter], path: str, payload: dict
) -> None:
    server, _ = keyed
    assert _status(server.url, path, None, payload) == 401
    assert _status(server.url, path, "not-the-secret", payload) == 401


def test_the_server_serves_requests_with_the_secret(keyed: tuple[SGLangServer, SGLangRouter]) -> None:
    server, _ = keyed
    assert _status(server.url, "/generate", KEY, GENERATE) == 200
    assert client.generate(server.url, [1, 2, 3], {"max_new_tokens": 2, "temperature": 0})["output_ids"]
    client.set_weight_version(server.url, 3)
    assert client.weight_version(server.url) == "3"
    assert requests.get(f"{server.url}/health", timeout=10).status_code == 200  # health checks need no secret


def test_the_router_demands_the_secret_and_passes_it_to_its_workers(keyed: tuple[SGLangServer, SGLangRouter]) -> None:
    server, router = keyed
    assert _status(router.url, "/generate", None, GENERATE) == 401
    assert requests.get(f"{router.url}/workers", timeout=10).status_code == 401
    assert _status(router.url, "/flush_cache", None) == 401
    assert [w["url"] for w in router.list_workers()] == [server.url]

    async def through_router() -> dict:
        async with aiohttp.ClientSession() as session:
            return await client.generate_async(session, router.url, GENERATE)

    assert asyncio.run(through_router())["output_ids"]  # the worker demands the secret too: the router sent it


def test_a_client_without_the_secret_is_told_why(
    keyed: tuple[SGLangServer, SGLangRouter], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, _ = keyed
    monkeypatch.setenv(API_KEY_ENV, "wrong")
    with pytest.raises(EngineError, match=f"401.*{API_KEY_ENV}"):
        client.flush_cache(server.url, attempts=1)


def test_the_secret_is_on_no_command_line(keyed: tuple[SGLangServer, SGLangRouter]) -> None:
    server, router = keyed
    assert server.log_path.stat().st_mode & 0o077 == 0  # SGLang logs its arguments: owner-only
    for leader in (server.process, router.process):
        assert leader is not None and leader.pid is not None
        proc = psutil.Process(leader.pid)
        for p in [proc, *proc.children(recursive=True)]:
            assert KEY not in " ".join(p.cmdline())
