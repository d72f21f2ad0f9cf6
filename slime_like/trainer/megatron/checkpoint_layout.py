"""Megatron-LM's checkpoint directory layout (as slime saves and loads it), written atomically.

    <root>/latest_checkpointed_iteration.txt   "<iteration>" or "release" (no newline); replaced last
    <root>/iter_0000019/                        one checkpoint; the iteration is the 0-based rollout id
        metadata.json, common.pt, .metadata, __*_*.distcp   Megatron torch_dist (metadata.json written last)
        critic/                                 PPO's critic, a torch_dist checkpoint of its own (ours)
        slime_like_state.json                   rollout id and data/buffer state (ours)
        slime_like_complete                     completion marker, written after everything else (ours)
    <root>/release/                             a model-only checkpoint (tools/convert_hf_to_torch_dist.py)
    <root>/rollout/global_dataset_state_dict_19.pt   slime's data position after rollout 19 (slime writes it)

A save writes into the sibling `iter_XXXXXXX.tmp/`, renames it into place, then replaces the tracker: a save
cut off midway leaves only the temporary directory, and the tracker names the previous checkpoint. A directory
with our state file but no marker (a partial copy) is never loaded. A save that fails (a full disk included:
CheckpointSaveError) removes its temporary directory and leaves the previous checkpoint as the one to load. A directory without our state file is
someone else's (slime's, Megatron's, the converter's): complete when Megatron's metadata.json is there.
Pure Python at import (torch only inside read_slime_data_state): argument checks use it before anything heavy is
imported.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

TRACKER = "latest_checkpointed_iteration.txt"
RELEASE = "release"
STATE_FILE = "slime_like_state.json"
COMPLETE_MARKER = "slime_like_complete"
CRITIC_DIR = "critic"
_TORCH_DIST_MARKER = "metadata.json"  # Megatron's dist_checkpointing writes it when all shards are written
_ITER_RE = re.compile(r"iter_(\d{7})")
_FORMAT = 1


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded; the message names it and what to do."""


class CheckpointSaveError(OSError):
    """A save that failed for lack of disk space; the message names the checkpoint kept and what to do."""


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
# How a full disk reads once it has crossed a process boundary (Ray task errors, torch.distributed.checkpoint).
_DISK_FULL_TEXT = ("No space left on device", "Disk quota exceeded")


def iteration_dir(root: str | Path, iteration: int | None) -> Path:
    """The directory of an iteration (None: the release checkpoint) under a run's save directory."""
    return Path(root) / (RELEASE if iteration is None else f"iter_{iteration:07d}")


def parse_dir_name(name: str) -> tuple[bool, int | None]:
    """(is a checkpoint directory name, its iteration): `iter_0000019` -> (True, 19), `release` -> (True, None)."""
    if name == RELEASE:
        return True, None
    match = _ITER_RE.fullmatch(name)
    return (True, int(match.group(1))) if match else (False, None)


def read_tracker(root: str | Path) -> int | None:
    """The iteration latest_checkpointed_iteration.txt names (None: release)."""
    path = Path(root) / TRACKER
    text = path.read_text().strip()
    if text == RELEASE:
        return None
    try:
        return int(text)
    except ValueError:
        raise CheckpointError(
            f"{path} holds {text[:40]!r}, not an iteration number or 'release': fix or delete the file"
        ) from None


def write_tracker(root: str | Path, iteration: int | None) -> None:
    """Atomically replace the tracker: a temporary file, flushed to disk, then os.replace."""
    path = Path(root) / TRACKER
    tmp = path.with_name(f".{TRACKER}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(RELEASE if iteration is None else str(iteration))  # as Megatron writes it: no newline
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # the old tracker stays in place, naming the previous checkpoint
        raise


def incomplete_reason(directory: str | Path) -> str | None:
    """Why a checkpoint directory cannot be loaded (None: it is complete)."""
    directory = Path(directory)
    if not directory.is_dir():
        return "does not exist"
    if (directory / STATE_FILE).exists():
        if not (directory / COMPLETE_MARKER).exists():
            return f"has no {COMPLETE_MARKER} marker: its save was cut off (or it is a partial copy)"
        return None
    if not (directory / _TORCH_DIST_MARKER).exists():
        return f"has no Megatron {_TORCH_DIST_MARKER}: its save was cut off, or it is not a torch_dist checkpoint"
    return None


@dataclass(frozen=True)
class Checkpoint:
    """One loadable checkpoint directory, its iteration (None: release), and a note when it is not the one the
    tracker names (that one was cut off): the caller logs it."""

    directory: Path
    iteration: int | None
    note: str | None = None

    @property
    def release(self) -> bool:
        """A release checkpoint (converted weights): model only, loaded as a fresh start."""
        return self.iteration is None

    def state(self) -> dict[str, Any] | None:
        """Our state file (rollout id, data/buffer state); None for a checkpoint written by slime or Megatron."""
        path = self.directory / STATE_FILE
        return json.loads(path.read_text()) if path.exists() else None


def slime_data_state_path(checkpoint: Checkpoint) -> Path | None:
    """Where slime saves its data position for a checkpoint: <root>/rollout/global_dataset_state_dict_<iter>.pt."""
    if checkpoint.iteration is None:
        return None
    return checkpoint.directory.parent / "rollout" / f"global_dataset_state_dict_{checkpoint.iteration}.pt"


def read_slime_data_state(checkpoint: Checkpoint) -> dict[str, Any] | None:
    """slime's saved data position of a checkpoint (sample_offset, epoch_id, sample_group_index, sample_index,
    metadata), or None when slime wrote none; a file that cannot be read is a CheckpointError naming it."""
    path = slime_data_state_path(checkpoint)
    if path is None or not path.is_file():
        return None
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)  # plain ints and a dict: no code runs
    except Exception as exc:
        raise CheckpointError(f"{path}: cannot read slime's data position ({exc}); move the file away to start the "
                              "data from its beginning") from exc  # fmt: skip
    if not isinstance(state, dict) or "sample_offset" not in state:
        raise CheckpointError(f"{path}: not slime's data-source state (no sample_offset)")
    return state


def _iterations(root: Path) -> list[int]:
    """The iterations with an `iter_XXXXXXX` directory under root, ascending."""
    found = []
    for path in root.iterdir() if root.is_dir() else ():
        is_ckpt, iteration = parse_dir_name(path.name)
        if is_ckpt and iteration is not None and path.is_dir():
            found.append(iteration)
    return sorted(found)


def find_checkpoint(path: str | Path, flag: str = "--load") -> Checkpoint | None:
    """The checkpoint `flag` names: a run's save directory (tracker) or one iter_*/release directory.

    None when there is none (no tracker, not a checkpoint directory). When the tracker names a checkpoint
    that is missing or incomplete, the newest complete one before it is used (its note says so); an
    incomplete directory named directly, or no complete one at all, is a CheckpointError.
    """
    path = Path(path)
    if (path / TRACKER).is_file():
        wanted = read_tracker(path)
        target = iteration_dir(path, wanted)
        reason = incomplete_reason(target)
        if reason is None:
            return Checkpoint(target, wanted)
        earlier = [i for i in _iterations(path) if wanted is not None and i < wanted]
        complete = [i for i in earlier if incomplete_reason(iteration_dir(path, i)) is None]
        if not complete:
            raise CheckpointError(
                f"{flag} {path}: {TRACKER} names {target.name}, which {reason}, and there is no earlier complete "
                f"checkpoint there: point {flag} at a complete checkpoint, or remove {path / TRACKER} to start fresh"
            )
        fallback = iteration_dir(path, complete[-1])
        note = f"{flag} {path}: {target.name} {reason}; using the previous complete checkpoint, {fallback.name}"
        return Checkpoint(fallback, complete[-1], note)
    is_ckpt, iteration = parse_dir_name(path.name)
    if not is_ckpt:
        return None
    reason = incomplete_reason(path)
    if reason is not None:
        raise CheckpointError(
            f"{flag} {path}: this checkpoint {reason}; load an earlier one, or give its run directory "
            f"({path.parent}) to load the newest complete checkpoint"
        )
    return Checkpoint(path, iteration)


def require_checkpoint(path: str | Path, flag: str, step: int | None = None) -> Checkpoint:
    """find_checkpoint, raising CheckpointError when `path` holds no Megatron checkpoint; with `step`, the run
    directory's iter_<step> instead of the tracker's (slime's --ref-ckpt-step, --opd-teacher-ckpt-step)."""
    if step is not None:
        target = iteration_dir(path, step)
        reason = incomplete_reason(target) if target.is_dir() else "no such directory"
        if reason is not None:
            raise CheckpointError(f"{flag} {path} at step {step}: {target} cannot be loaded ({reason})")
        return Checkpoint(target, step)
    found = find_checkpoint(path, flag)
    if found is None:
        raise CheckpointError(
            f"{flag} {path}: no Megatron checkpoint there (no {TRACKER}, and not an iter_XXXXXXX or {RELEASE} "
            "directory); make one from HF weights with tools/convert_hf_to_torch_dist.py"
        )
    return found


def resume_advice(save: str | Path | None) -> str:
    """What to `--load` after a run stopped: the newest complete checkpoint under its --save directory (a save
    that was cut off is passed over), or that there is none."""
    if not save:
        return "There is no checkpoint to resume from (no --save): start the run again."
    try:
        found = find_checkpoint(save, "--load")
    except (CheckpointError, OSError):
        found = None
    if found is None:
        return f"There is no complete checkpoint under --save {save} yet: start the run again."
    return f"The last complete checkpoint is {found.directory}: resume with --load {save}."


def write_state(directory: str | Path, rollout_id: int, rollout_state: dict[str, Any]) -> None:
    """Write our state file into a checkpoint being saved."""
    state = {"format": _FORMAT, "rollout_id": rollout_id, "rollout_state": rollout_state}
    (Path(directory) / STATE_FILE).write_text(json.dumps(state))


def temporary_dir(root: str | Path, iteration: int | None) -> Path:
    """Where a checkpoint is written before it is renamed into place: `iter_XXXXXXX.tmp` (or `release.tmp`)."""
    final = iteration_dir(root, iteration)
    return final.with_name(final.name + ".tmp")


def begin_save(root: str | Path, iteration: int | None) -> Path:
    """Create the empty temporary directory a checkpoint is written into (one process; the others wait)."""
    tmp = temporary_dir(root, iteration)
    if tmp.exists():
        shutil.rmtree(tmp)  # left by a save that was cut off
    tmp.mkdir(parents=True)
    return tmp


def commit_save(root: str | Path, iteration: int | None, tmp: Path, keep_last: int | None = None) -> Path:
    """Mark a written checkpoint complete, rename it into place, then replace the tracker; with keep_last,
    delete older checkpoints. Returns the checkpoint's directory."""
    root = Path(root)
    final = iteration_dir(root, iteration)
    (tmp / COMPLETE_MARKER).write_text(json.dumps({"iteration": iteration}))
    replaced = None
    if final.exists():  # the same iteration saved again (a run resumed from an earlier checkpoint)
        replaced = final.with_name(final.name + ".old")
        shutil.rmtree(replaced, ignore_errors=True)
        os.rename(final, replaced)
    os.rename(tmp, final)
    write_tracker(root, iteration)
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)
    if keep_last and iteration is not None:
        prune(root, iteration, keep_last)
    return final


@contextmanager
def saving(root: str | Path, iteration: int | None, keep_last: int | None = None) -> Iterator[Path]:
    """begin_save, yield the temporary directory to write into, then commit_save; on an error it is removed (a
    full disk raises CheckpointSaveError naming the checkpoint that is kept)."""
    tmp = temporary_dir(root, iteration)
    try:
        begin_save(root, iteration)
        yield tmp
        commit_save(root, iteration, tmp, keep_last)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if disk_full(exc):
            raise CheckpointSaveError(errno.ENOSPC, _disk_full_message(root, iteration, exc)) from exc
        raise


def disk_full(exc: BaseException) -> bool:
    """Whether an error (or one it was raised from) is a full disk or an exceeded quota."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _DISK_FULL:
            return True
        if any(text in str(current) for text in _DISK_FULL_TEXT):
            return True
        current = current.__cause__ or current.__context__
    return False


def _disk_full_message(root: str | Path, iteration: int | None, exc: BaseException) -> str:
    """What failed, what is kept, and what to do."""
    try:
        kept = find_checkpoint(root, "--load")
    except (CheckpointError, OSError):
        kept = None
    where = (
        f"{kept.directory.name} is still the checkpoint there (--load {root} resumes from it)"
        if kept is not None
        else "no earlier complete checkpoint is there"
    )
    return (
        f"saving checkpoint {iteration_dir(root, iteration).name} under {root}: the disk is full "
        f"({type(exc).__name__}: {str(exc)[:300]}). The partial save was removed; {where}. Free space (or keep fewer "
        "with --keep-last-n-checkpoints), then resume."
    )


def prune(root: str | Path, current: int, keep_last: int) -> list[Path]:
    """Delete complete iter_* checkpoints up to `current` but the newest keep_last; release and later ones stay."""
    root = Path(root)
    older = [i for i in _iterations(root) if i <= current and incomplete_reason(iteration_dir(root, i)) is None]
    removed = [iteration_dir(root, i) for i in older[: max(0, len(older) - keep_last)]]
    for path in removed:
        shutil.rmtree(path)
        logger.info("removed %s (--keep-last-n-checkpoints %d)", path, keep_last)
    return removed
