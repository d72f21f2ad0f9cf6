"""Per-rollout metrics computed from the groups that will train."""

from __future__ import annotations

import statistics
from typing import Any

from slime_like.core.sample import Sample, Status, scalar_reward


def task_reward(sample: Sample, reward_key: str | None) -> float:
    """The scored reward, before any --custom-reward-post-process-path."""
    if "raw_reward" in sample.metadata:
        return scalar_reward(Sample(reward=sample.metadata["raw_reward"], index=sample.index), reward_key)
    return scalar_reward(sample, reward_key)


def rollout_metrics(groups: list[list[Sample]], reward_key: str | None, prefix: str = "rollout") -> dict[str, Any]:
    """Reward mean/std, response lengths, and the share of each finish status."""
    samples = [s for g in groups for s in g]
    rewards = [task_reward(s, reward_key) for s in samples]
    lengths = [s.response_length for s in samples]
    n = max(1, len(samples))
    metrics = {
        f"{prefix}/num_samples": len(samples),
        f"{prefix}/reward_mean": statistics.fmean(rewards) if rewards else 0.0,
        f"{prefix}/reward_std": statistics.pstdev(rewards) if rewards else 0.0,
        f"{prefix}/response_len_mean": statistics.fmean(lengths) if lengths else 0.0,
        f"{prefix}/response_len_max": max(lengths, default=0),
        f"{prefix}/generated_tokens": sum(lengths),
    }
    if any("raw_reward" in s.metadata for s in samples):
        metrics[f"{prefix}/reward_processed_mean"] = statistics.fmean(scalar_reward(s, reward_key) for s in samples)
    for status in (Status.TRUNCATED, Status.ABORTED, Status.FAILED):
        metrics[f"{prefix}/{status.value}_rate"] = sum(s.status == status for s in samples) / n
    return metrics
