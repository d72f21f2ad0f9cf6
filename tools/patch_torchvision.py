"""Make torchvision 0.28 importable on a CPU-only torch (sglang imports it at module level).

PyPI ships only CUDA builds of torchvision; on CPU torch its compiled ops are missing, and the
unguarded fake registrations of `torchvision::nms`/`qnms` fail at import. Guard them with
`torchvision.extension._has_ops()`, as torchvision already does for its other registrations.
Idempotent; run by scripts/setup.sh with the venv's python.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

GUARD = "@(torch.library.register_fake({op}) if torchvision.extension._has_ops() else (lambda fn: fn))"


def patch(path: Path) -> bool:
    """Guard the two registrations in torchvision/_meta_registrations.py; True if the file changed."""
    text = path.read_text()
    new = text
    for op in ('"torchvision::nms"', '"torchvision::qnms"'):
        new = new.replace(f"@torch.library.register_fake({op})", GUARD.format(op=op))
    if new != text:
        path.write_text(new)
    return new != text


if __name__ == "__main__":
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("torchvision is not installed in this environment; run scripts/setup.sh")
    target = Path(next(iter(spec.submodule_search_locations))) / "_meta_registrations.py"
    print(f"[patch_torchvision] {'patched' if patch(target) else 'already patched'} {target}")
