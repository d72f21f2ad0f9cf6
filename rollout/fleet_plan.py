"""The fleets of a run: the policy alone, or one per model of --sglang-config (rollout/model_groups.py), started side
by side; their routers named in the arguments as slime names them."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from rollout.arguments import server_dtype
from rollout.fleet import EngineFleet, FleetSpec, policy_spec
from rollout.model_groups import ModelGroup, ServerGroup, cut_engines, load_model_groups, override_flags, place_groups

logger = logging.getLogger(__name__)


def model_spec(args: Any, model: ModelGroup, group: ServerGroup) -> FleetSpec:
    """The fleet spec of a model's engines (one fleet per model: its regular groups share their shape flags)."""
    overrides = dict(group.overrides)
    dtype = overrides.pop("dtype", server_dtype(args))
    return FleetSpec(
        name=model.name,
        model_path=model.model_path,
        num_gpus_per_engine=group.num_gpus_per_engine,
        dtype=dtype,
        extra_args=list(args.sglang_server_args) + override_flags(overrides),
        update_weights=model.update_weights,
    )


def plan_fleets(args: Any, rollout_slots: list[Any]) -> list[tuple[EngineFleet, list[list[Any]]]]:
    """Each fleet of the run with its engine slots, the policy's first: the policy alone, or one per model of
    --sglang-config."""
    if getattr(args, "sglang_config", None) is None:
        return [(EngineFleet(args, policy_spec(args)), cut_engines(rollout_slots, args.rollout_num_gpus_per_engine))]
    models = sorted(load_model_groups(args), key=lambda m: not m.update_weights)
    placed = place_groups(models, rollout_slots)
    planned = []
    for model in models:
        regular = next(g for g in model.server_groups if g.worker_type == "regular")
        planned.append((EngineFleet(args, model_spec(args, model, regular)), placed[model.name]))
    return planned


def start_fleets(planned: list[tuple[EngineFleet, list[list[Any]]]], use_gpu: bool, env: dict[str, str]) -> None:
    """Start every fleet side by side (each waits for its engines); if one fails, stop them all and raise its error."""
    with ThreadPoolExecutor(max_workers=len(planned)) as pool:
        futures = [pool.submit(fleet.start, slots, use_gpu, env) for fleet, slots in planned]
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        for fleet, _ in planned:
            fleet.stop()
        raise errors[0]


def expose_routers(args: Any, fleets: dict[str, EngineFleet]) -> None:
    """Name each model's router as slime does (`args.sglang_model_routers[name] = (host, port)`, which
    `get_model_url` reads); with exactly one frozen model and no --rm-url, --rm-url becomes its /generate (slime's
    on-policy distillation reward posts the teacher's scoring requests there)."""
    routers = {}
    for name, fleet in fleets.items():
        url = urlsplit(fleet.router_url)
        routers[name] = (url.hostname, url.port)
    args.sglang_model_routers = routers
    frozen = [f for f in fleets.values() if not f.spec.update_weights]
    if getattr(args, "rm_url", None) is None and len(frozen) == 1:
        args.rm_url = f"{frozen[0].router_url}/generate"
        logger.info("--rm-url is model %r's router: %s", frozen[0].spec.name, args.rm_url)
