"""Other libraries' HTTP clients of SGLang, given the run's secret when they call the run's router or servers.

Every SGLang server and the router demand the per-run secret (slime_like/core/secret.py), which slime's own
clients never send: a plugin that calls them through such a client would get 401 on every request. Today one
library does: strands-sglang (slime's examples/strands_sglang), whose `SGLangClient` opens its own aiohttp session
(`get_client_from_slime_args`). Once a plugin has imported it, its sessions are opened with the secret when their
base URL is the running rollout's router or one of its servers (never another URL).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from rollout.context import current_context
from slime_like.core.secret import auth_headers, same_origin

PATCHED = "_slime_like_run_secret"


def ours(url: str) -> bool:
    """Whether `url` is the running rollout's router or one of its servers (or another model's router)."""
    ctx = current_context()
    if ctx is None:
        return False
    routers = getattr(ctx.args, "sglang_model_routers", None) or {}
    others = [f"http://{host}:{port}" for host, port in routers.values()]
    return same_origin(url, [ctx.router_url, *ctx.server_urls, *others])


def _with_secret(get_session: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """strands-sglang's `SGLangClient._get_session`, adding the run's secret to each session it opens for us."""

    @functools.wraps(get_session)
    def _get_session(self: Any) -> Any:
        fresh = self._session is None or self._session.closed
        session = get_session(self)
        if fresh and ours(self.base_url):
            session.headers.update(auth_headers())
        return session

    return _get_session


def authorize_foreign_clients() -> None:
    """Give the run's secret to the clients of the libraries above that plugins have imported (once each)."""
    module = sys.modules.get("strands_sglang.client")
    client = getattr(module, "SGLangClient", None)
    if client is not None and not getattr(client._get_session, PATCHED, False):
        client._get_session = _with_secret(client._get_session)
        setattr(client._get_session, PATCHED, True)
