"""strands-sglang's client (slime's examples/strands_sglang) sends the run's secret to the run's router, and only
there, once a plugin has imported it (rollout/foreign_clients.py)."""

from __future__ import annotations

import asyncio
from argparse import Namespace

import pytest

from rollout.context import RolloutContext, running
from rollout.foreign_clients import authorize_foreign_clients
from slime_like.core.secret import API_KEY_ENV

ROUTER = "http://127.0.0.1:30000"


def test_the_strands_sglang_client_sends_the_run_secret_to_our_router(monkeypatch: pytest.MonkeyPatch) -> None:
    from strands_sglang.client import SGLangClient

    monkeypatch.setenv(API_KEY_ENV, "s3cret")
    original = SGLangClient._get_session
    try:
        authorize_foreign_clients()
        authorize_foreign_clients()  # patched once
        unwrapped = getattr(original, "__wrapped__", original)  # patched already if a rollout ran in this process
        assert SGLangClient._get_session.__wrapped__ is unwrapped  # type: ignore[attr-defined]

        async def headers(url: str, inside: bool) -> dict[str, str]:
            client = SGLangClient(url)
            ctx = RolloutContext(Namespace(), None, ROUTER, None, None, server_urls=["http://127.0.0.1:30001"])  # type: ignore[arg-type]
            if inside:
                with running(ctx):
                    session = client._get_session()
            else:
                session = client._get_session()
            out = dict(session.headers)
            await client.close()
            return out

        assert asyncio.run(headers(ROUTER, inside=True)) == {"Authorization": "Bearer s3cret"}
        assert asyncio.run(headers("http://127.0.0.1:30001/", inside=True)) == {"Authorization": "Bearer s3cret"}
        assert asyncio.run(headers("http://example.com:30000", inside=True)) == {}  # never to another host
        assert asyncio.run(headers(ROUTER, inside=False)) == {}  # outside a rollout: not ours to tell
    finally:
        SGLangClient._get_session = original  # type: ignore[method-assign]
