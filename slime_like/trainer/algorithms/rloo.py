"""RLOO advantages: each sample's reward minus the mean reward of the other samples of its prompt.

REINFORCE Leave-One-Out (Kool et al., 2019, "Buy 4 REINFORCE Samples, Get a Baseline for Free!";
applied to LLMs by Ahmadian et al., 2024, "Back to Basics: Revisiting REINFORCE Style Optimization
for Learning from Human Feedback in LLMs"):
    A_i = r_i - (1 / (k - 1)) * sum_{j != i} r_j
an unbiased baseline, since it does not depend on sample i. A group of one sample has no baseline
and gets A = 0 (it cannot tell good from bad). It needs the whole group, so the rollout side computes it before
the DP split (buffer/group_rewards.py, where the function lives).
"""

from __future__ import annotations

from buffer.group_rewards import rloo_advantages

__all__ = ["rloo_advantages"]
