"""Load user plugins named by dotted import path, failing early with the flag in the message."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from slime_like.core.errors import PluginError


def load_plugin(path: str, flag: str, *, params: int | None = None, is_async: bool | None = None) -> Callable[..., Any]:
    """Import `package.module.attr` named by `flag`; optionally check arity and async-ness."""
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise PluginError(f"{flag}={path!r}: expected a dotted path like 'package.module.function'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import-time failure is the user's to see, with the flag
        raise PluginError(f"{flag}={path!r}: cannot import module {module_name!r}: {exc!r}") from exc
    try:
        fn = getattr(module, attr)
    except AttributeError:
        raise PluginError(f"{flag}={path!r}: module {module_name!r} has no attribute {attr!r}") from None
    if not callable(fn):
        raise PluginError(f"{flag}={path!r}: {attr!r} is not callable")
    if is_async is not None and inspect.iscoroutinefunction(fn) != is_async:
        kind = "an async function (async def)" if is_async else "a plain function (not async)"
        raise PluginError(f"{flag}={path!r}: must be {kind}")
    if params is not None:
        try:
            inspect.signature(fn).bind(*([None] * params))
        except TypeError:
            raise PluginError(
                f"{flag}={path!r}: must accept {params} positional argument(s), its signature is {inspect.signature(fn)}"
            ) from None
    return fn
