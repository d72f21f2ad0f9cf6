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


def rollout_metrics(
    groups: list[list[Sample]], reward_key: str | None, prefix: str = "rollout", args: Any = None
) -> dict[str, Any]:
    """Reward mean/std, response lengths, and the share of each finish status; with `args`, what --log-passrate and
    --log-reward-category ask for."""
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
    if args is not None:
        metrics.update(slime_log_metrics(groups, args, prefix))
    return metrics


def slime_log_metrics(groups: list[list[Sample]], args: Any, prefix: str = "rollout") -> dict[str, float]:
    """--log-passrate: pass@k over each group (a sample passes at --eval-pass-threshold); --log-reward-category KEY:
    the share of samples per value of reward[KEY] (slime's error_cat/<value>); --log-multi-turn and
    --log-correct-samples (rollout/slime_stats.py)."""
    from rollout.evaluation import ks_for, pass_at_k
    from rollout.slime_stats import correct_sample_metrics, multi_turn_metrics

    metrics: dict[str, float] = {}
    sized = [g for g in groups if g]
    if getattr(args, "log_passrate", False) and sized:
        threshold = args.eval_pass_threshold
        for k in ks_for(min(len(g) for g in sized)):
            passed = [pass_at_k(len(g), sum(task_reward(s, args.reward_key) >= threshold for s in g), k) for g in sized]
            metrics[f"{prefix}/pass@{k}"] = statistics.fmean(passed)
    key = getattr(args, "log_reward_category", None)
    samples = [s for g in groups for s in g]
    if key is not None and samples:
        categories = [s.reward.get(key) if isinstance(s.reward, dict) else None for s in samples]
        for value in dict.fromkeys(categories):
            metrics[f"error_cat/{value}"] = categories.count(value) / len(samples)
    if getattr(args, "log_multi_turn", False):
        metrics.update(multi_turn_metrics(samples, args.rollout_max_response_len))
    if getattr(args, "log_correct_samples", False):
        rewards = [task_reward(s, args.reward_key) for s in samples]
        metrics.update(correct_sample_metrics(samples, rewards, args.rollout_max_response_len, prefix))
    return metrics
