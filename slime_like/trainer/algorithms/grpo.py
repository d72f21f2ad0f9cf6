"""GRPO and Dr.GRPO advantages: each sample's reward normalised within its prompt's group.

GRPO (Shao et al., 2024, "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open
Language Models", section 4.1.2, outcome supervision): A_i = (r_i - mean(r_group)) / std(r_group),
the same for every token of sample i. The std is the unbiased one (divide by n - 1), plus eps, as
slime, verl and TRL compute it (torch.std's default), so [1, 0, 1, 0] gives +-0.866, not +-1; a group
whose rewards are all equal gets A = 0, and so does a group of one sample (no spread to measure). Dr.GRPO (Liu et al., 2025, "Understanding
R1-Zero-Like Training: A Critical Perspective", arXiv:2503.20783) drops the std division
(--disable-grpo-std-normalization), which otherwise up-weights groups of near-equal rewards.
GSPO and CISPO use these advantages too. They need the whole group, so the rollout side computes them before the
DP split (buffer/group_rewards.py, where the functions live).
"""

from __future__ import annotations

from buffer.group_rewards import by_group, grpo_advantages, normalize_group_rewards

__all__ = ["by_group", "grpo_advantages", "normalize_group_rewards"]
