"""slime.rollout.rm_hub.gpqa: the multiple-choice scorer (ours: rollout/rm_hub/gpqa.py)."""

from __future__ import annotations

from typing import Any

from rollout.rm_hub.gpqa import gpqa_reward


def compute_gpqa_reward(response: str, label: Any, metadata: dict[str, Any] | None = None) -> float:
    """slime's compute_gpqa_reward: 1.0 when the answer picks the right option, else 0.0."""
    return gpqa_reward(response, label, metadata)
