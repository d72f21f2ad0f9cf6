"""rollout.ssl_context: httpx's default verifying SSL context made once per process, the others as before."""

from __future__ import annotations

import ssl

import certifi
import httpx
import httpx._transports.default as transports
import pytest

from rollout import ssl_context
from rollout.ssl_context import share_default_ssl_context


def context(client: httpx.AsyncClient) -> ssl.SSLContext:
    return client._transport._pool._ssl_context  # type: ignore[attr-defined]


def test_default_clients_share_one_context_and_others_keep_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    # httpx as it comes (an endpoint started earlier in this process may have shared its context already); both
    # restored after the test.
    current = transports.create_ssl_context
    monkeypatch.setattr(transports, "create_ssl_context", getattr(current, "original", current))
    monkeypatch.setattr(ssl_context, "_shared", {})
    before = context(httpx.AsyncClient())
    share_default_ssl_context()
    share_default_ssl_context()  # idempotent: not wrapped twice
    one, two = context(httpx.AsyncClient()), context(httpx.AsyncClient())
    assert one is two and one is not before
    assert one.verify_mode == ssl.CERT_REQUIRED and one.check_hostname  # still the verifying default
    unverified = context(httpx.AsyncClient(verify=False))
    assert unverified is not one and unverified.verify_mode == ssl.CERT_NONE
    monkeypatch.setenv("SSL_CERT_FILE", certifi.where())
    assert context(httpx.AsyncClient()) is not one  # another CA bundle: another context
