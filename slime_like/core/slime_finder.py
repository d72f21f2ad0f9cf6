"""Make `import slime` find our compatibility package, but only when the real slime is not installed.

`install()` appends a finder to the END of `sys.meta_path`: Python's normal path finder runs first, so an
installed slime (or any `slime` package on `sys.path`) always wins. Only when nothing else provides the
top-level `slime` does this finder load `slime_like/compat/slime/` under the name `slime`; its submodules
are then found through that package's `__path__`, so every module exists once, as `slime.<name>`.
The package is named here by its folder, never imported by this layer.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

COMPAT_DIR = Path(__file__).resolve().parent.parent / "compat" / "slime"


class SlimeCompatFinder(importlib.abc.MetaPathFinder):
    """Finds the top-level `slime` in slime_like's compatibility folder (consulted after every other finder)."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        """A spec for `slime` from COMPAT_DIR; None for every other name."""
        if fullname != "slime":
            return None
        return importlib.util.spec_from_file_location(
            "slime", COMPAT_DIR / "__init__.py", submodule_search_locations=[str(COMPAT_DIR)]
        )


def install() -> None:
    """Append the finder to sys.meta_path once (idempotent)."""
    if not any(isinstance(f, SlimeCompatFinder) for f in sys.meta_path):
        sys.meta_path.append(SlimeCompatFinder())


def is_compat(module_name: str = "slime") -> bool:
    """True when `slime` (already imported) is our compatibility package, not the real slime."""
    module = sys.modules.get(module_name.partition(".")[0])
    return module is not None and Path(getattr(module, "__file__", "") or "").resolve().parent == COMPAT_DIR
