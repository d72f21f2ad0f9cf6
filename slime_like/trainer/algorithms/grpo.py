"""GRPO and Dr.GRPO advantages: each sample's reward normalised within its prompt's group.

GRPO (Shao et al., 2024, "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open
Language Models", section 4.1.2, outcome supervision): A_i = (r_i - mean(r_group)) / std(r_group),
the same for every token of sample i. The std is the unbiased one (divide by n - 1), plus eps, as
slime, verl and TRL compute it (torch.std's default), so [1, 0, 1, 0] gives +-0.866, not +-1; a group
whose rewards are all equal gets A = 0, and so does a group of one sample (no spread to measure). Dr.GRPO (Liu et al., 2025, "Understanding
R1-Zero-Like Training: A Critical Perspective", arXiv:2503.20783) drops the std division
(--disable-grpo-std-normalization), which otherwise up-weights groups of near-equal rewards.
GSPO and CISPO use these advantages too.
"""

from __future__ import annotations

import math


def normalize_group_rewards(rewards: list[float], use_std: bool = True, eps: float = 1e-6) -> list[float]:
    """(r - mean(group)) / (unbiased std(group) + eps); without std it is Dr.GRPO's r - mean."""
    mean = sum(rewards) / len(rewards)
    centred = [r - mean for r in rewards]
    if not use_std or len(rewards) < 2:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / (len(rewards) - 1))
    return [c / (std + eps) for c in centred]


def by_group(group_ids: list[int]) -> dict[int, list[int]]:
    """Row indices of each group, in row order."""
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(g, []).append(i)
    return groups


def grpo_advantages(rewards: list[float], group_ids: list[int], use_std: bool = True) -> list[float]:
    """One scalar advantage per sample: its reward normalised within its group."""
    out = [0.0] * len(rewards)
    for rows in by_group(group_ids).values():
        for i, a in zip(rows, normalize_group_rewards([rewards[i] for i in rows], use_std), strict=True):
            out[i] = a
    return out
