"""Load user plugins named by dotted import path, failing early with the flag in the message.

A hook follows one of two contracts: ours (docs/plugins.md) or slime's. The rule (`plugin_contract`):
`--plugin-api native|slime` forces one for every hook; with `auto` (the default) a hook follows slime's
contract when it is defined in a `slime` module (the real slime or our compatibility package) or its
defining module imports slime (an `import slime...` / `from slime... import` statement in its source, or a
`slime` module or an object defined in one among its globals); every other hook follows ours.

Loading a plugin that follows slime's contract also makes every sample from then on slime's `Sample` (our
compatibility subclass, `use_slime_samples`), so slime plugins find slime's fields and helpers on them.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import logging
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from slime_like.core import slime_finder
from slime_like.core.errors import PluginError
from slime_like.core.sample import use_sample_type

logger = logging.getLogger(__name__)
COMPAT_PACKAGE = "slime_like.compat.slime"  # named, never imported, by this layer (slime_finder.py)

PLUGIN_APIS = ("auto", "native", "slime")
Signature = tuple[int | None, bool | None]  # (positional parameters it must accept, async?), None: not checked
_logged: set[tuple[str, str, str]] = set()


def load_plugin(path: str, flag: str, *, params: int | None = None, is_async: bool | None = None) -> Callable[..., Any]:
    """Import `package.module.attr` named by `flag`; optionally check arity and async-ness."""
    fn = _import_plugin(path, flag, params, is_async)
    if plugin_contract(fn)[0] == "slime":
        use_slime_samples()
    return fn


def _import_plugin(path: str, flag: str, params: int | None, is_async: bool | None) -> Callable[..., Any]:
    """The callable `path` names, its arity and async-ness checked when given."""
    slime_finder.install()  # plugins written for slime import it; ours stands in when slime is absent
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
    check_signature(fn, path, flag, params, is_async)
    return fn


def use_slime_samples() -> None:
    """Make new samples slime's `Sample` (`slime.utils.types`, our compatibility subclass of ours) from now on."""
    slime_finder.install()
    importlib.import_module("slime")
    # With the real slime installed, our compatibility package is not `slime`: its Sample is then loaded under its
    # own name (the only copy), so samples still carry slime's fields and helpers.
    name = "slime.utils.types" if slime_finder.is_compat() else f"{COMPAT_PACKAGE}.utils.types"
    use_sample_type(importlib.import_module(name).Sample)


def check_signature(
    fn: Any, path: str, flag: str, params: int | None, is_async: bool | None, contract: str = "native"
) -> None:
    """Raise PluginError naming the flag when `fn` is not (a)sync as required or cannot take `params` arguments."""
    note = " (slime's contract, see --plugin-api)" if contract == "slime" else ""
    if is_async is not None and inspect.iscoroutinefunction(fn) != is_async:
        kind = "an async function (async def)" if is_async else "a plain function (not async)"
        raise PluginError(f"{flag}={path!r}: must be {kind}{note}")
    if params is not None:
        try:
            inspect.signature(fn).bind(*([None] * params))
        except TypeError:
            raise PluginError(
                f"{flag}={path!r}: must accept {params} positional argument(s){note}, "
                f"its signature is {inspect.signature(fn)}"
            ) from None


def is_slime_name(name: str | None) -> bool:
    """`slime` or `slime.<anything>` (not `slime_like`)."""
    return isinstance(name, str) and (name == "slime" or name.startswith("slime."))


def _source_imports_slime(module: ModuleType) -> bool:
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError, SyntaxError):  # no source (compiled, built-in): the globals decide
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(is_slime_name(a.name) for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and not node.level and is_slime_name(node.module):
            return True
    return False


def imports_slime(module: ModuleType) -> bool:
    """Whether a module imports slime: an import statement in its source, or slime objects among its globals."""
    for value in vars(module).values():
        name = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None)
        if is_slime_name(name):
            return True
    return _source_imports_slime(module)


def plugin_contract(obj: Any, api: str = "auto") -> tuple[str, str]:
    """("slime" | "native", why) for a loaded hook under --plugin-api `api` (the rule in this module's docstring)."""
    if api in ("native", "slime"):
        return api, f"--plugin-api {api}"
    if api != "auto":
        raise PluginError(f"--plugin-api {api!r}: choose one of {', '.join(PLUGIN_APIS)}")
    module_name = getattr(obj, "__module__", None) or type(obj).__module__
    if is_slime_name(module_name):
        return "slime", f"it is defined in {module_name}"
    module = sys.modules.get(module_name or "")
    if module is not None and imports_slime(module):
        return "slime", f"its module {module_name} imports slime"
    return "native", f"its module {module_name} does not import slime"


def load_hook(path: str, flag: str, api: str, native: Signature, slime: Signature) -> tuple[Any, str]:
    """Load a hook, decide its contract, check the signature that contract needs; returns (hook, contract)."""
    obj = _import_plugin(path, flag, None, None)
    auto = plugin_contract(obj)
    contract, why = auto if api == "auto" else plugin_contract(obj, api)
    if "slime" in (auto[0], contract):  # a module that imports slime, or --plugin-api slime forcing it
        use_slime_samples()
    params, is_async = slime if contract == "slime" else native
    check_signature(obj, path, flag, params, is_async, contract)
    if (flag, path, contract) not in _logged:  # arguments are checked before the manager loads them again
        _logged.add((flag, path, contract))
        logger.info("%s=%s follows the %s plugin contract: %s", flag, path, contract, why)
    return obj, contract
