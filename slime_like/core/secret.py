"""The per-run secret that every SGLang server and the router demand on each request (SGLang's `--api-key`).

The driver makes it once per run (`ensure_api_key`, on the first actor it places) and keeps it in its environment
under API_KEY_ENV; every actor gets it through its Ray runtime environment, so trainer ranks, the rollout manager,
engine actors and the router's actor all read the same value, and the processes they start inherit it. A value the
user sets in that variable is used as it is (e.g. to call the servers by hand while the run is up).

It is made on one machine too: 127.0.0.1 is reachable by every local user, the cost is one header per request,
and one code path is the one that is tested.
"""

from __future__ import annotations

import os
import secrets
from urllib.parse import urlsplit

API_KEY_ENV = "SLIME_LIKE_API_KEY"

# Run by `python -c` in front of sglang-router, which takes its key only as `--api-key`: the key is added to the
# arguments inside the process, so it stays out of the command line (world-readable in /proc/PID/cmdline on
# every node; the environment is readable by the same user only). One `--api-key=KEY` token, so a key that starts
# with `-` is still read as the value.
LAUNCH_WITH_KEY = f"""
import os, runpy, sys
module = sys.argv.pop(1)
key = os.environ.get({API_KEY_ENV!r})
if key:
    sys.argv.append("--api-key=" + key)
sys.argv[0] = module
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def api_key() -> str | None:
    """This run's secret, or None in a process that is not part of a run (tests, tools)."""
    return os.environ.get(API_KEY_ENV) or None


run_secret = api_key  # the name where a parameter called `api_key` shadows the function


def new_api_key() -> str:
    """A fresh secret of 256 bits, never starting with `-`."""
    # token_urlsafe's alphabet has `-`: a key starting with it is read as a flag by the argument parsers of
    # SGLang and sglang-router (`--api-key: expected one argument`), one run in 64. Hex has no `-`.
    return secrets.token_hex(32)


def ensure_api_key() -> str:
    """This run's secret, made now (`new_api_key`) if this process has none yet."""
    key = api_key()
    if key is None:
        key = os.environ[API_KEY_ENV] = new_api_key()
    return key


def auth_headers(key: str | None = None) -> dict[str, str]:
    """`Authorization: Bearer <secret>` for a request to our servers ({} without a secret)."""
    key = key if key is not None else api_key()
    return {"Authorization": f"Bearer {key}"} if key else {}


def same_origin(url: str, ours: list[str]) -> bool:
    """Whether `url` points at one of the servers in `ours` (scheme, host and port); the secret goes nowhere else."""
    target = urlsplit(url)
    for base in ours:
        own = urlsplit(base if "//" in base else f"http://{base}")
        if (target.scheme, target.hostname, target.port) == (own.scheme, own.hostname, own.port):
            return True
    return False
