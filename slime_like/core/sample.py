"""The Sample type shared by rollout, buffer and training."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Status(enum.StrEnum):
    """Lifecycle of one generated sample."""

    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


@dataclass
class Sample:
    """One prompt and (after rollout) one response with its tokens, log-probs and reward."""

    prompt: str | list[dict[str, Any]] = ""
    tokens: list[int] = field(default_factory=list)  # prompt tokens followed by response tokens
    response: str = ""
    response_length: int = 0
    label: Any = None
    reward: float | dict[str, float] | None = None
    loss_mask: list[int] | None = None  # one entry per response token
    rollout_log_probs: list[float] | None = None  # one entry per response token
    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    group_index: int | None = None
    index: int | None = None
    weight_version: int | None = None

    @property
    def prompt_length(self) -> int:
        """Number of prompt tokens at the front of `tokens`."""
        return len(self.tokens) - self.response_length

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict (status as its string value)."""
        d = dict(self.__dict__)
        d["status"] = self.status.value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Sample:
        """Inverse of `to_dict`."""
        d = dict(d)
        d["status"] = Status(d.get("status", "pending"))
        return cls(**d)


def scalar_reward(sample: Sample, reward_key: str | None = None) -> float:
    """The sample's reward as a float (dict rewards are read at `reward_key`)."""
    reward = sample.reward
    if isinstance(reward, dict):
        if reward_key is None:
            raise ValueError(f"sample {sample.index} has a dict reward {sorted(reward)}: set --reward-key")
        reward = reward[reward_key]
    return float(reward or 0.0)
