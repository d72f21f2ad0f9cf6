"""Bringing a restarted policy engine to the fleet's current weight version without the trainer, where the weights of
that version can be read on the engine's hosts: version 0 is the engine's own checkpoint (not in a LoRA run, where
the adapters come from the trainer); with delta weight sync (--update-weight-local-checkpoint-dir) every published
version is on the shared --update-weight-disk-dir, and the engine's host pulls it into its local checkpoint
(rollout/delta_pull.py) and the engine reloads that, a state equal to the other engines' (each applied version is
checked against the trainer's checksums). Otherwise the engine waits, out of the router, for the next weight update,
which sends the trainer's weights to it with the others (in a multi-LoRA run every adapter, not only those changed).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import ray

from rollout import delta_format as fmt
from rollout import sglang_client as client
from rollout.engines import Engine

logger = logging.getLogger(__name__)


def published_dir(args: Any) -> str:
    """Where the trainer publishes versions for the engines' hosts (as slime_like/trainer/weights/factory.py)."""
    return args.update_weight_disk_dir or os.path.join(args.output_dir, "weights")


def checkpoint_version(args: Any) -> int:
    """The weight version an engine holds when it starts from its checkpoint: 0, or none (-1) in a LoRA run, where
    the servers start with the base only and version 0 is the base with the trainer's adapters (weights/lora.py)."""
    return -1 if getattr(args, "lora_rank", 0) else 0


def can_catch_up(args: Any, version: int) -> bool:
    """Whether an engine can be brought to `version` here, without the trainer."""
    if checkpoint_version(args) < 0:  # LoRA: the adapters come from the trainer alone, every one (its update sends all)
        return False
    if version == 0:
        return True
    local = getattr(args, "update_weight_local_checkpoint_dir", None)
    return bool(local) and fmt.version_dir(published_dir(args), version).is_dir()


def catch_up(args: Any, engine: Engine, version: int) -> None:
    """Bring a fresh engine (serving its checkpoint, nothing in flight) to weight `version` and tag it."""
    timeout = args.update_weight_timeout
    if version:
        local, source = args.update_weight_local_checkpoint_dir, published_dir(args)
        meta = fmt.read_index(fmt.version_dir(source, version))
        chain = str(meta.get("chain", ""))  # a full version has none: the pull seeds from it
        reports = ray.get([a.pull_weights.remote(local, source, version, chain) for a in engine.parts], timeout=timeout)
        if None in reports:
            raise RuntimeError(f"{engine.describe()}: its server is not running, nothing to bring up to date")
        client.update_weights_from_disk(engine.url, local, version, timeout)
        logger.info("%s: brought to weight version %d from %s (%s)", engine.describe(), version, local, reports[0])
    client.set_weight_version(engine.url, version, timeout)
    engine.version = version
