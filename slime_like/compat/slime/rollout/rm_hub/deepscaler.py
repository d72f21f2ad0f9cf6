"""slime.rollout.rm_hub.deepscaler: DeepScaleR's rule-based reward (ours: rollout/rm_hub/boxed.py)."""

from __future__ import annotations

from typing import Any

from rollout.rm_hub import boxed


def grade_answer_mathd(given: str, ground_truth: str) -> bool:
    """Equal after MATH normalisation (numerically when both are numbers)."""
    return boxed.deepscaler_reward("\\boxed{" + given + "}", ground_truth) == 1.0


def get_deepscaler_rule_based_reward(response: str, label: Any) -> int:
    """1 when the last boxed answer after `</think>` (or `###Response`) matches the label, else 0."""
    if "</think>" not in response and "###Response" not in response:
        return 0
    return int(boxed.deepscaler_reward(response.rsplit("###Response", 1)[-1], label))
