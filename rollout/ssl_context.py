"""One default SSL context per rollout process for httpx's clients.

Agent frameworks build their own `openai.AsyncOpenAI` per sample; each builds an httpx transport, which loads the CA
bundle into a fresh SSL context: ~19 ms of CPU of the ~21 ms a client costs (measured on our 2-core machine), on the
rollout's event loop, though calls to our endpoint are plain HTTP on 127.0.0.1. The default verifying context (no
client certificate) is the same every time, so it is made once and shared: an SSLContext serves any number of
connections. Contexts with a client certificate, another CA bundle or verification off are made as before.
"""

from __future__ import annotations

import os
import ssl
from typing import Any

_shared: dict[tuple[Any, ...], ssl.SSLContext] = {}


def share_default_ssl_context() -> None:
    """Make httpx build its default verifying SSL context once in this process (idempotent)."""
    import httpx._transports.default as transports  # where httpx's transports call create_ssl_context

    original = transports.create_ssl_context
    if getattr(original, "shares_default", False):
        return

    def create_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True) -> ssl.SSLContext:
        if verify is not True or cert is not None:
            return original(verify=verify, cert=cert, trust_env=trust_env)
        env = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")) if trust_env else (None, None)
        key = (trust_env, *env)
        if key not in _shared:
            _shared[key] = original(verify=verify, cert=cert, trust_env=trust_env)
        return _shared[key]

    create_ssl_context.shares_default = True  # type: ignore[attr-defined]
    create_ssl_context.original = original  # type: ignore[attr-defined]
    transports.create_ssl_context = create_ssl_context
