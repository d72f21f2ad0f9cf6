"""Filters and reward post-processing with slime's signatures.

--buffer-filter-path slime_plugins.filters.newest_first
--dynamic-sampling-filter-path slime_plugins.filters.drop_odd_groups
--rollout-sample-filter-path slime_plugins.filters.remove_odd_samples
--custom-reward-post-process-path slime_plugins.filters.centre_rewards
--rollout-all-samples-process-path slime_plugins.filters.record_all_samples
"""

from slime.rollout.filter_hub.base_types import DynamicFilterOutput

CALLS = {"buffer": [], "all_samples": []}


def newest_first(args, rollout_id, buffer, num_samples):
    """Serve the groups handed back last first, popping them from the buffer (slime's contract)."""
    CALLS["buffer"].append((rollout_id, [g[0].group_index for g in buffer], num_samples))
    chosen = [buffer.pop() for _ in range(min(num_samples, len(buffer)))]
    return chosen


def drop_odd_groups(args, samples, **kwargs):
    """Drop groups of odd group index."""
    keep = samples[0].group_index % 2 == 0
    return DynamicFilterOutput(keep=keep, reason=None if keep else "odd_group")


def remove_odd_samples(args, data):
    """Every odd-indexed sample trains with loss mask 0 (it still counts in its group)."""
    for group in data:
        for sample in group:
            sample.remove_sample = sample.index % 2 == 1


def centre_rewards(args, samples):
    """(raw rewards, rewards minus their group's mean): replaces the trainer's normalisation."""
    raw = [sample.get_reward_value(args) for sample in samples]
    by_group = {}
    for sample, reward in zip(samples, raw, strict=True):
        by_group.setdefault(sample.group_index, []).append(reward)
    means = {g: sum(r) / len(r) for g, r in by_group.items()}
    return raw, [reward - means[s.group_index] for s, reward in zip(samples, raw, strict=True)]


def record_all_samples(args, samples, data_source):
    """Record every group the rollout generated (dropped ones too) and what the data source still holds."""
    CALLS["all_samples"].append(
        ([g[0].group_index for g in samples], [s.remove_sample for g in samples for s in g], len(data_source))
    )
