"""RLOO advantages: each sample's reward minus the mean reward of the other samples of its prompt.

REINFORCE Leave-One-Out (Kool et al., 2019, "Buy 4 REINFORCE Samples, Get a Baseline for Free!";
applied to LLMs by Ahmadian et al., 2024, "Back to Basics: Revisiting REINFORCE Style Optimization
for Learning from Human Feedback in LLMs"):
    A_i = r_i - (1 / (k - 1)) * sum_{j != i} r_j
an unbiased baseline, since it does not depend on sample i. A group of one sample has no baseline
and gets A = 0 (it cannot tell good from bad).
"""

from __future__ import annotations

from slime_like.trainer.algorithms.grpo import by_group


def rloo_advantages(rewards: list[float], group_ids: list[int]) -> list[float]:
    """One scalar advantage per sample: reward minus the leave-one-out mean of its group."""
    out = [0.0] * len(rewards)
    for rows in by_group(group_ids).values():
        k = len(rows)
        if k < 2:
            continue
        total = sum(rewards[i] for i in rows)
        for i in rows:
            out[i] = rewards[i] - (total - rewards[i]) / (k - 1)
    return out
