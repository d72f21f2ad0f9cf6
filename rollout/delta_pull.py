"""The engine side of delta weight sync: bring a host-local HF checkpoint to a published weight version.

slime does this inside SGLang (its patch's /pull_weights); here each engine's per-node Ray actor does it on its
host (rollout/engines.py, EngineNode.pull_weights), then the engine reloads the local checkpoint through the
ordinary /update_weights_from_disk. Versions are `weight_v{N:06d}/` under the shared --update-weight-disk-dir
(rollout/delta_format.py). A chain starts at version 0, the engine's own model path; each delta names its base
version and the chain (one per trainer transport) it belongs to; a full version resets the chain.

Every pull holds a per-host file lock and records the applied version in `<local>/.weight_sync/state.json`, so the
actors of engines sharing a host apply each version once. The record is removed while a version is applied: an
apply cut short (or failing its checksums) leaves no record, and the next pull rebuilds from the base or the
newest full version, then replays the deltas.
"""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import numpy as np

from rollout import delta_format as fmt

SYNC_DIR = ".weight_sync"
# Engine node actors are named `<prefix><engine>:<node rank>:<nonce>` so the trainer can find every host to pull on.
ENGINE_NODE_PREFIX = "slime-engine-node:"


@contextmanager
def _locked(local: Path) -> Iterator[None]:
    sync = local / SYNC_DIR
    sync.mkdir(parents=True, exist_ok=True)
    with open(sync / "lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def read_state(local: Path | str) -> dict[str, Any] | None:
    """The local checkpoint's {chain, version}, or None (fresh, or an apply was cut short)."""
    try:
        return json.loads((Path(local) / SYNC_DIR / "state.json").read_text())
    except FileNotFoundError:
        return None


def _write_state(local: Path, state: dict[str, Any] | None) -> None:
    path = local / SYNC_DIR / "state.json"
    if state is None:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def _reset(source: Path, local: Path, chain: str, version: int) -> None:
    """Make `local` a copy of the full checkpoint `source` (files it lacks are removed), at `version`."""
    _write_state(local, None)
    files = [p for p in sorted(source.iterdir()) if p.is_file()]
    for path in files:  # a real copy: deltas are written into these files in place
        shutil.copyfile(path, local / path.name)
    names = {p.name for p in files}
    for path in local.iterdir():
        if path.is_file() and path.name not in names:
            path.unlink()
    for path in files:
        if (local / path.name).stat().st_size != path.stat().st_size:
            raise fmt.DeltaError(f"copying {path} to {local} came out short: is the disk full?")
    _write_state(local, {"chain": chain, "version": version})


def apply_version(local: Path | str, version_dir: Path | str) -> int:
    """Apply one published delta to the local checkpoint in place, checking every tensor; the bytes changed.

    Refuses a delta whose base is not the local version (out of order, or of another chain) and raises on any
    checksum mismatch, leaving the local checkpoint marked for a rebuild."""
    local, version_dir = Path(local), Path(version_dir)
    meta = fmt.read_index(version_dir)
    if not fmt.is_delta(meta):
        raise fmt.DeltaError(f"{version_dir} is a full checkpoint, not a delta")
    version, base = int(meta["version"]), int(meta["base_version"])
    state = read_state(local)
    if state is None or state.get("chain") != meta.get("chain") or int(state["version"]) != base:
        at = "nothing usable" if state is None else f"version {state['version']} of chain {state.get('chain')}"
        raise fmt.DeltaError(
            f"out-of-order delta: {version_dir.name} builds on version {base} of chain {meta.get('chain')}, but the "
            f"local checkpoint {local} holds {at}; pull the versions in order (rollout/delta_pull.py, pull)"
        )
    if meta.get("compression_format") != fmt.COMPRESSION:
        raise fmt.DeltaError(f"{version_dir.name}: compression {meta.get('compression_format')!r} is not zstd")
    encoding, algorithm = meta["delta_encoding"], meta["checksum_format"]
    locations = fmt.tensor_locations(local)
    _write_state(local, None)  # from here until every checksum matched, the local bytes are not a known version
    maps: dict[Path, tuple[Any, mmap.mmap]] = {}
    mismatched, changed = [], 0
    try:
        for delta_file in sorted(version_dir.glob("*.safetensors")):
            header, start = fmt.safetensors_header(delta_file)
            blob = delta_file.read_bytes()
            wanted = header.get("__metadata__", {})
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                if name not in locations:
                    raise fmt.DeltaError(f"{version_dir.name} changes {name}, which the local checkpoint lacks")
                path, offset, nbytes, _ = locations[name]
                if path not in maps:
                    handle = open(path, "r+b")  # noqa: SIM115 - closed in the finally below
                    maps[path] = (handle, mmap.mmap(handle.fileno(), 0))
                region = np.ndarray((nbytes,), np.uint8, buffer=maps[path][1], offset=offset)
                begin, end = info["data_offsets"]
                got = fmt.apply(region, blob[start + begin : start + end], encoding, algorithm)
                del region  # the mmap cannot close while a view of it lives
                changed += end - begin
                if got != wanted.get(name):
                    mismatched.append(name)
    finally:
        for handle, mapped in maps.values():
            mapped.flush()
            mapped.close()
            handle.close()
    if mismatched:
        raise fmt.DeltaError(
            f"checksum mismatch after applying {version_dir.name} to {local}: {', '.join(mismatched[:5])}"
            f"{' ...' if len(mismatched) > 5 else ''} (a corrupt delta or a wrong base); the next pull rebuilds "
            "the local checkpoint from the base"
        )
    _write_state(local, {"chain": meta.get("chain"), "version": version})
    return changed


def pull(local: Path | str, base: Path | str, source: Path | str, target: int, chain: str) -> dict[str, Any]:
    """Bring the local checkpoint to version `target` of `chain` (0: the engine's own `base`); what it did."""
    local, base, source = Path(local), Path(base), Path(source)
    start = time.monotonic()
    local.mkdir(parents=True, exist_ok=True)
    with _locked(local):
        state = read_state(local)
        plan: list[int] = []  # deltas to apply, newest first
        seed: tuple[Path, int] | None = None
        version = target
        while not (state and state.get("chain") == chain and int(state["version"]) == version):
            if version == 0:
                seed = (base, 0)
                break
            meta = fmt.read_index(fmt.version_dir(source, version))
            if not fmt.is_delta(meta):  # a full version: the chain restarts there
                seed = (fmt.version_dir(source, version), version)
                break
            if meta.get("chain") != chain:
                raise fmt.DeltaError(
                    f"{fmt.version_dir(source, version)} belongs to another trainer's chain ({meta.get('chain')}, not "
                    f"{chain}): another run writes to this --update-weight-disk-dir; give each run its own"
                )
            plan.append(version)
            if int(meta["base_version"]) >= version:
                raise fmt.DeltaError(f"{fmt.version_dir(source, version)} builds on a later version")
            version = int(meta["base_version"])
        if seed is not None:
            _reset(seed[0], local, chain, seed[1])
        changed = sum(apply_version(local, fmt.version_dir(source, v)) for v in reversed(plan))
    return {"seeded_from": seed[1] if seed else None, "applied": plan[::-1], "delta_bytes": changed,
            "seconds": time.monotonic() - start}  # fmt: skip


def pull_on_engine_hosts(local: str, source: str, target: int, chain: str, timeout: float) -> list[dict[str, Any]]:
    """Run `pull` on every engine node actor of this Ray namespace (each host an engine spans); their reports."""
    import ray

    names = [n for n in ray.util.list_named_actors() if n.startswith(ENGINE_NODE_PREFIX)]
    if not names:
        raise fmt.DeltaError(
            "delta weight sync applies each version on the rollout hosts through the engine actors this run starts, "
            "and none was found: --update-weight-mode delta needs engines started by this run (not external ones)"
        )
    refs = []
    for name in names:
        with suppress(ValueError):  # its engine was taken out since the listing: it catches up when restarted
            refs.append(ray.get_actor(name).pull_weights.remote(local, source, target, chain))
    reports = []
    for ref in refs:
        try:
            report = ray.get(ref, timeout=timeout)
        except ray.exceptions.RayActorError:  # died with its engine (taken out by the fleet, which restarts it)
            continue
        if report is not None:  # None: a restarted engine not started yet (rollout/catch_up.py brings it up to date)
            reports.append(report)
    return reports
