"""Finished groups -> training data: group reward normalisation, loss masks (the engine splits over DP)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from slime_like.sample import Sample, Status


def normalize_group_rewards(rewards: list[float], use_std: bool = True, eps: float = 1e-6) -> list[float]:
    """GRPO: (r - mean(group)) / (std(group) + eps); without std it is Dr.GRPO's r - mean."""
    mean = sum(rewards) / len(rewards)
    centred = [r - mean for r in rewards]
    if not use_std:
        return centred
    # Population std (divide by n), as in the GRPO formulation over the sampled group.
    std = math.sqrt(sum(c * c for c in centred) / len(rewards))
    return [c / (std + eps) for c in centred]


def scalar_reward(sample: Sample, reward_key: str | None = None) -> float:
    """The sample's reward as a float (dict rewards are read at `reward_key`)."""
    reward = sample.reward
    if isinstance(reward, dict):
        if reward_key is None:
            raise ValueError(f"sample {sample.index} has a dict reward {sorted(reward)}: set --reward-key")
        reward = reward[reward_key]
    return float(reward or 0.0)


@dataclass
class TrainData:
    """Column-wise training data, one entry per sample."""

    tokens: list[list[int]] = field(default_factory=list)
    response_lengths: list[int] = field(default_factory=list)
    loss_masks: list[list[int]] = field(default_factory=list)
    raw_rewards: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)  # after group normalisation
    rollout_log_probs: list[list[float]] = field(default_factory=list)
    sample_indices: list[int] = field(default_factory=list)
    weight_versions: list[int | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def select(self, indices: list[int]) -> TrainData:
        """The rows at `indices`, in that order."""
        return TrainData(**{name: [col[i] for i in indices] for name, col in self.__dict__.items()})

    def num_tokens(self) -> int:
        """Total tokens (prompt + response) over all rows."""
        return sum(len(t) for t in self.tokens)


def build_train_data(
    groups: list[list[Sample]],
    *,
    normalize: bool = True,
    use_std: bool = True,
    reward_key: str | None = None,
) -> TrainData:
    """Normalise rewards within each group and collect the columns the trainer needs.

    Failed samples (generation or reward function failed) and aborted ones carry no usable reward:
    they neither take part in their group's statistics nor get trained on.
    """
    data = TrainData()
    for group in groups:
        usable = [s for s in group if s.status not in (Status.FAILED, Status.ABORTED) and s.response_length > 0]
        if not usable:
            continue
        raw = [scalar_reward(s, reward_key) for s in usable]
        normed = normalize_group_rewards(raw, use_std) if normalize else raw
        for sample, r_raw, r in zip(usable, raw, normed, strict=True):
            mask = sample.loss_mask if sample.loss_mask is not None else [1] * sample.response_length
            if len(mask) != sample.response_length:
                raise ValueError(
                    f"sample {sample.index}: loss_mask has {len(mask)} entries for {sample.response_length} response tokens"
                )
            data.tokens.append(list(sample.tokens))
            data.response_lengths.append(sample.response_length)
            data.loss_masks.append(list(mask))
            data.raw_rewards.append(r_raw)
            data.rewards.append(r)
            data.rollout_log_probs.append(list(sample.rollout_log_probs or [0.0] * sample.response_length))
            data.sample_indices.append(sample.index)
            data.weight_versions.append(sample.weight_version)
    return data
