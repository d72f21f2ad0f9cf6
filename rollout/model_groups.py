"""--sglang-config: slime's YAML of named model groups served in one run (the policy, a teacher, a reward model).

Schema (slime's, docs/multi-node.md shows an example)::

    sglang:
      - name: actor                  # unique; its router's address is args.sglang_model_routers["actor"]
        model_path: /path            # default --hf-checkpoint
        update_weights: true         # default: whether model_path is --hf-checkpoint
        num_gpus_per_engine: 1       # default --rollout-num-gpus-per-engine
        server_groups:               # (`engine_groups` is slime's older name)
          - worker_type: regular     # regular or placeholder here (prefill/decode/encoder: refused, see below)
            num_gpus: 2              # slots of --rollout-num-gpus this group takes, in order
            num_gpus_per_engine: 1   # default: the model's
            overrides: {dtype: float32}   # SGLang server flags, applied after the --sglang-* ones

Each model is one engine fleet (rollout/fleet.py, planned in rollout/fleet_plan.py) with its own router; the one with
`update_weights` is the policy: it generates the rollouts and alone receives weight updates. The groups' `num_gpus`
add up to --rollout-num-gpus, and the rollout slots are handed out in file order.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

MODEL_KEYS = {"name", "model_path", "update_weights", "num_gpus_per_engine", "server_groups", "engine_groups"}
GROUP_KEYS = {"worker_type", "num_gpus", "num_gpus_per_engine", "overrides"}
WORKER_TYPES = ("regular", "prefill", "decode", "placeholder", "encoder")
# Why prefill/decode (and encoder) groups cannot run here: the same reason --prefill-num-servers is refused.
DISAGGREGATION_MISSING = (
    "prefill/decode disaggregation moves the KV cache between engines with a transfer engine (mooncake or nixl, "
    "over RDMA/UCX), which is not installed here and has no CPU path, and the engines and router here do not start "
    "in disaggregation mode"
)


@dataclass
class ServerGroup:
    """One `server_groups` entry: `num_gpus` slots cut into engines of `num_gpus_per_engine`."""

    worker_type: str
    num_gpus: int
    num_gpus_per_engine: int
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class ModelGroup:
    """One `sglang` entry: a model served by its own engines behind its own router."""

    name: str
    model_path: str
    update_weights: bool
    server_groups: list[ServerGroup]


def _fail(path: str, what: str) -> ValueError:
    return ValueError(f"--sglang-config {path}: {what}")


def override_flags(overrides: dict[str, Any]) -> list[str]:
    """SGLang ServerArgs fields as server flags: `mem_fraction_static: 0.8` -> `--mem-fraction-static 0.8`, a true
    bool as the bare flag, a list as the flag with its values."""
    flags: list[str] = []
    for key, value in overrides.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is False or value is None:
            continue  # SGLang's defaults are off; a false field adds nothing
        elif isinstance(value, list):
            flags += [flag, *map(str, value)]
        else:
            flags += [flag, str(value)]
    return flags


def _server_group(path: str, model: str, raw: Any, default_per_engine: int) -> ServerGroup:
    if not isinstance(raw, dict):
        raise _fail(path, f"model {model!r}: each server group must be a mapping, got {raw!r}")
    unknown = set(raw) - GROUP_KEYS
    if unknown:
        raise _fail(path, f"model {model!r}: unknown server group keys {sorted(unknown)} (known: {sorted(GROUP_KEYS)})")
    kind = raw.get("worker_type")
    if kind not in WORKER_TYPES:
        raise _fail(path, f"model {model!r}: worker_type {kind!r} is not one of {', '.join(WORKER_TYPES)}")
    if kind in ("prefill", "decode", "encoder"):
        raise _fail(
            path,
            f"model {model!r}: worker_type {kind} (disaggregated serving) is not supported here: "
            f"{DISAGGREGATION_MISSING}. Use worker_type regular: every engine prefills and decodes",
        )
    gpus, per_engine = raw.get("num_gpus"), raw.get("num_gpus_per_engine") or default_per_engine
    if not isinstance(gpus, int) or gpus <= 0:
        raise _fail(path, f"model {model!r}: num_gpus must be a positive integer, got {gpus!r}")
    if kind == "regular" and gpus % per_engine:
        raise _fail(path, f"model {model!r}: num_gpus {gpus} is not a multiple of num_gpus_per_engine {per_engine}")
    overrides = raw.get("overrides") or {}
    if not isinstance(overrides, dict):
        raise _fail(path, f"model {model!r}: overrides must be a mapping of SGLang server fields, got {overrides!r}")
    return ServerGroup(kind, gpus, per_engine, dict(overrides))


def load_model_groups(args: Any) -> list[ModelGroup]:
    """Parse and check --sglang-config against the run's flags (ValueError naming the file, the model and the fix)."""
    import yaml

    path = args.sglang_config
    if not Path(path).is_file():
        raise _fail(path, "no such file")
    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict) or not isinstance(data.get("sglang"), list) or not data["sglang"]:
        raise _fail(path, "the file must hold a top-level `sglang:` list of models (name, server_groups, ...)")
    models: list[ModelGroup] = []
    for raw in data["sglang"]:
        if not isinstance(raw, dict) or not raw.get("name"):
            raise _fail(path, f"each model needs a name, got {raw!r}")
        name = str(raw["name"])
        unknown = set(raw) - MODEL_KEYS
        if unknown:
            raise _fail(path, f"model {name!r}: unknown keys {sorted(unknown)} (known: {sorted(MODEL_KEYS)})")
        if name in {m.name for m in models}:
            raise _fail(path, f"model name {name!r} appears twice")
        per_engine = raw.get("num_gpus_per_engine") or args.rollout_num_gpus_per_engine
        raw_groups = raw.get("server_groups") or raw.get("engine_groups") or []
        if not raw_groups:
            raise _fail(path, f"model {name!r} has no server_groups")
        groups = [_server_group(path, name, g, per_engine) for g in raw_groups]
        paths = {g.overrides.pop("model_path", None) for g in groups} - {None}
        model_path = raw.get("model_path") or (paths.pop() if len(paths) == 1 else None) or args.hf_checkpoint
        if paths - {model_path}:
            raise _fail(path, f"model {name!r}: its server groups name different model paths {sorted(paths)}")
        if not (Path(model_path) / "config.json").is_file():
            raise _fail(path, f"model {name!r}: model_path {model_path} holds no Hugging Face config.json")
        update = raw.get("update_weights")
        if update is None:  # slime's inference: the policy is the model served from --hf-checkpoint
            update = str(model_path) == str(args.hf_checkpoint)
            if not update:
                logger.info("--sglang-config: model %r (%s) is frozen: it receives no weight updates", name, model_path)
        models.append(ModelGroup(name, str(model_path), bool(update), groups))
    total = sum(g.num_gpus for m in models for g in m.server_groups)
    if total != args.rollout_num_gpus:
        raise _fail(path, f"its groups take {total} GPUs in all, but --rollout-num-gpus is {args.rollout_num_gpus}: "
                          f"set --rollout-num-gpus {total}")  # fmt: skip
    policies = [m.name for m in models if m.update_weights]
    if len(policies) != 1:
        raise _fail(
            path,
            f"exactly one model must receive the trainer's weights (update_weights: true, or model_path = "
            f"--hf-checkpoint): it generates the rollouts; found {policies or 'none'}",
        )
    for m in models:
        regular = [g for g in m.server_groups if g.worker_type == "regular"]
        if len({(g.num_gpus_per_engine, repr(sorted(g.overrides.items()))) for g in regular}) > 1:
            raise _fail(path, f"model {m.name!r}: its regular server groups differ in engine size or overrides, "
                              "which one fleet here cannot serve: make them one group, or separate models")  # fmt: skip
        if not any(g.worker_type == "regular" for g in m.server_groups):
            raise _fail(path, f"model {m.name!r} has only placeholder groups: nothing would serve it")
    return models


def cut_engines(slots: list[Any], per_engine: int) -> list[list[Any]]:
    """Slots cut into engines of `per_engine` (a remainder too small for one is left unused)."""
    return [slots[i : i + per_engine] for i in range(0, len(slots) - per_engine + 1, per_engine)]


def place_groups(models: list[ModelGroup], rollout_slots: list[Any]) -> dict[str, list[list[Any]]]:
    """Each model's engine slots: the rollout slots taken in file order, `num_gpus` per server group (placeholder
    groups take theirs and start nothing)."""
    placed: dict[str, list[list[Any]]] = {}
    start = 0
    for model in models:
        engines = placed.setdefault(model.name, [])
        for group in model.server_groups:
            taken = rollout_slots[start : start + group.num_gpus]
            start += group.num_gpus
            if group.worker_type == "regular":
                engines += cut_engines(taken, group.num_gpus_per_engine)
    return placed
