"""slime.rollout.rm_hub.math_dapo_utils: DAPO's strict-box score (ours: rollout/rm_hub/boxed.py)."""

from __future__ import annotations

from typing import Any

from rollout.rm_hub import boxed


def compute_score(
    solution_str: str, ground_truth: str, strict_box_verify: bool = False, pause_tokens_index: Any = None
) -> dict[str, Any]:
    """{"score": +1/-1, "acc": bool, "pred": str} from the last boxed answer in the final 300 characters."""
    score = boxed.dapo_reward(solution_str, ground_truth)
    found = boxed.last_boxed(solution_str[-300:])
    return {"score": score, "acc": score > 0, "pred": "" if found is None else boxed.normalize_final_answer(found)}
