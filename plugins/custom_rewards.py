"""Example --custom-rm-path functions: one sample at a time, or a whole group with --group-rm.

--custom-rm-path plugins.custom_rewards.boxed_math_with_format            (dict reward; add --reward-key score)
--custom-rm-path plugins.custom_rewards.majority_vote --group-rm          (label-free, TTRL-style)
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from rollout.rm_hub.boxed import deepscaler_reward, last_boxed
from slime_like.core.sample import Sample


def boxed_math_with_format(args: Any, sample: Sample) -> dict[str, float]:
    """Correctness of the boxed answer plus a format term; train on `score` (--reward-key score)."""
    correct = deepscaler_reward(sample.response, sample.label)
    formatted = 1.0 if last_boxed(sample.response) is not None else 0.0
    return {"score": correct + 0.1 * formatted, "correct": correct, "formatted": formatted}


async def majority_vote(args: Any, group: list[Sample]) -> list[float]:
    """1.0 for samples whose boxed answer is the group's most common one (no label needed), else 0.0."""
    answers = [last_boxed(s.response) for s in group]
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return [0.0] * len(group)
    winner, _ = votes.most_common(1)[0]
    return [1.0 if a == winner else 0.0 for a in answers]
