"""Example --custom-generate-function-path with --group-generate: one call per group (a temperature ladder).

    --custom-generate-function-path plugins.group_generate.generate_group --group-generate

Samples of one prompt get spread temperatures (diverse groups give GRPO more signal). A group-level
function sees finished samples too (partial rollout hands back whole groups), so it skips them.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rollout.context import RolloutContext
from rollout.generate import FINISHED, generate
from slime_like.core.sample import Sample

LOW, HIGH = 0.6, 1.2


async def generate_group(ctx: RolloutContext, group: list[Sample], sampling_params: dict[str, Any]) -> list[Sample]:
    """Generate every unfinished sample of the group, the i-th of n at temperature LOW + i * (HIGH - LOW) / (n - 1)."""
    n = len(group)

    def params_for(i: int) -> dict[str, Any]:
        return {**sampling_params, "temperature": LOW + i * (HIGH - LOW) / max(1, n - 1)}

    await asyncio.gather(*(generate(ctx, s, params_for(i)) for i, s in enumerate(group) if s.status not in FINISHED))
    return group
