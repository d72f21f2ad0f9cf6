"""slime's --custom-convert-samples-to-train-data-path: `fn(args, samples) -> dict` of slime's train-data keys, read
into our TrainData. slime's `rewards` are what its advantages take (already post-processed), so they train as
they are (reward_normalized); group ids and weight versions come from the samples, found by `sample_indices`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from buffer.train_data import TrainData
from rollout.slime_contract import slime_args
from slime_like.core.sample import Sample

FLAG = "--custom-convert-samples-to-train-data-path"
REQUIRED = ("tokens", "response_lengths", "rewards", "loss_masks", "sample_indices")
# Keys slime's trainer reads for logging or features we compute elsewhere: accepted and not used (docs/plugins.md).
IGNORED = ("raw_reward", "truncated", "round_number", "rollout_ids", "rollout_mask_sums", "metadata")
OPTIONAL = ("rollout_log_probs", "rollout_routed_experts", "teacher_log_probs", "multimodal_train_inputs")


def convert_hook(fn: Callable[..., Any]) -> Callable[[Any, list[list[Sample]]], TrainData]:
    """slime's converter as `(args, groups) -> TrainData`: it gets the rollout's samples flat, in group order."""

    def convert(args: Any, groups: list[list[Sample]]) -> TrainData:
        data = fn(slime_args(args), [s for g in groups for s in g])
        if not isinstance(data, dict):
            raise TypeError(f"{FLAG}: must return a dict of slime's train-data keys, got {type(data).__name__}")
        return train_data_from_slime(data, groups)

    return convert


def train_data_from_slime(data: dict[str, Any], groups: list[list[Sample]]) -> TrainData:
    """slime's train-data dict as TrainData; each row's sample is found by its `sample_indices` entry."""
    missing = [k for k in REQUIRED if k not in data]
    unknown = sorted(set(data) - set(REQUIRED) - set(IGNORED) - set(OPTIONAL))
    if missing or unknown:
        raise ValueError(
            f"{FLAG}: the dict misses {missing} and has keys we cannot train with {unknown} "
            f"(needed: {list(REQUIRED)}; optional: {list(OPTIONAL)}; accepted and unused: {list(IGNORED)})"
        )
    n = len(data["tokens"])
    for key in (*REQUIRED, *(k for k in OPTIONAL if k in data)):
        if len(data[key]) != n:
            raise ValueError(f"{FLAG}: {key!r} has {len(data[key])} entries, 'tokens' has {n}")
    where = {s.index: (group_id, s) for group_id, g in enumerate(groups) for s in g}
    out = TrainData()
    for row in range(n):
        index = int(data["sample_indices"][row])
        if index not in where:
            raise ValueError(f"{FLAG}: sample_indices[{row}] = {index} is not a sample of this rollout")
        group_id, sample = where[index]
        length = int(data["response_lengths"][row])
        mask = [int(m) for m in _as_list(data["loss_masks"][row])]
        if len(mask) != length:
            raise ValueError(f"{FLAG}: loss_masks[{row}] has {len(mask)} entries for response length {length}")
        out.tokens.append([int(t) for t in _as_list(data["tokens"][row])])
        out.response_lengths.append(length)
        out.loss_masks.append(mask)
        out.raw_rewards.append(float(data["rewards"][row]))
        out.reward_normalized.append(True)
        out.group_ids.append(group_id)
        out.sample_indices.append(index)
        out.weight_versions.append(sample.weight_version)
        log_probs = data.get("rollout_log_probs")
        out.rollout_log_probs.append(None if log_probs is None else [float(x) for x in _as_list(log_probs[row])])
    for key in ("rollout_routed_experts", "teacher_log_probs", "multimodal_train_inputs"):  # per row, as given
        if key in data:
            setattr(out, key, list(data[key]))
    return out


def _as_list(values: Any) -> list[Any]:
    return values.tolist() if hasattr(values, "tolist") else list(values)
