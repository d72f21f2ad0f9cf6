"""DAPO's overlong reward shaping: a soft length penalty over a buffer before the generation budget.

Yu et al., 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", Soft Overlong Punishment, with
L_max the generation budget (--rollout-max-response-len) and L_cache the buffer
(--overlong-buffer-len):
    R_length(y) = 0                              if |y| <= L_max - L_cache
                = ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
                = -1                             if |y| > L_max
added to the task reward (times --overlong-penalty-factor). DAPO's other pieces live elsewhere:
clip-higher is --eps-clip-high, the token-level loss is --loss-agg-mode token-mean, and dynamic
sampling is the rollout's --dynamic-sampling-filter-path. The rollout side adds the penalty to each reward before
the group baselines (buffer/group_rewards.py, where the function lives).
"""

from __future__ import annotations

from buffer.group_rewards import overlong_penalty

__all__ = ["overlong_penalty"]
