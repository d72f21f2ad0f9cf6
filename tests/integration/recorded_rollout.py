"""One rollout on a running server with every /generate it sent recorded: the agent tests check trained ids
against these."""

from __future__ import annotations

from typing import Any

import rollout.generate
from rollout.manager import RolloutManager
from slime_like.core.sample import Sample


def recorded_rollout(args: Any, server_url: str) -> tuple[list[list[Sample]], dict[str, Any], list[dict[str, Any]]]:
    """Rollout 0 of `args` on the server at `server_url` (also its router); the groups, the metrics and each
    /generate sent as {"rid", "input_ids", "out"}."""
    sent: list[dict[str, Any]] = []
    original = rollout.generate.post_generate

    async def recording(ctx: Any, payload: dict[str, Any], retries: int | None = None) -> dict[str, Any]:
        out = await original(ctx, payload, retries)
        sent.append({"rid": payload["rid"], "input_ids": list(payload["input_ids"]), "out": out})
        return out

    rollout.generate.post_generate = recording  # type: ignore[assignment]
    manager = RolloutManager(args, server_urls=[server_url], router_url=server_url)
    try:
        groups, metrics = manager.generate(0)
    finally:
        rollout.generate.post_generate = original  # type: ignore[assignment]
        manager.shutdown()
    return groups, metrics, sent
