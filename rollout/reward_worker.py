"""A scoring worker process: reads `{"target", "args"}` JSON lines on stdin, answers `{"ok"}` or `{"error"}` lines.

Started by rollout.worker_pool; it runs on its own main thread, so libraries that time out with
`signal.alarm` could use it, but the pool enforces timeouts by killing the process instead.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any


def _resolve(target: str, cache: dict[str, Callable[..., Any]]) -> Callable[..., Any]:
    if target not in cache:
        module, _, name = target.partition(":")
        cache[target] = getattr(importlib.import_module(module), name)
    return cache[target]


def main() -> None:
    """Serve calls until stdin closes."""
    # Answers go to the real stdout; anything the scored code prints goes to stderr instead.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout = sys.stderr
    logging.basicConfig(level=logging.ERROR)
    cache: dict[str, Callable[..., Any]] = {}
    for line in sys.stdin:
        try:
            request = json.loads(line)
            answer = {"ok": _resolve(request["target"], cache)(*request["args"])}
        except Exception as exc:  # the scorer's failure is reported to the caller, the worker lives on
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    main()
