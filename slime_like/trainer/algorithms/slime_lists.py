"""slime's view of the training batch: per-sample lists under slime's keys, and what slime lets a hook change.

slime's hooks read the batch (buffer.train_data.TrainData) as per-sample lists: a custom loss's `batch`, a
--rollout-data-postprocess-path hook's `rollout_data`. slime_lists makes those from a batch's columns;
apply_slime_lists writes back what slime lets a hook change, checked.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from buffer.train_data import TrainData

# TrainData's per-token columns -> slime's keys; each is handed to a slime hook when every sample has it.
SLIME_KEYS = {
    "old_log_probs": "log_probs",
    "advantages": "advantages",
    "ref_log_probs": "ref_log_probs",
    "rollout_log_probs": "rollout_log_probs",
    "returns": "returns",
    "old_values": "values",
    "entropy": "entropy",  # --use-rollout-entropy
}
# What slime lets a --rollout-data-postprocess-path hook change: it trains.
SLIME_WRITABLE = ("loss_masks", "advantages")


def slime_lists(batch: TrainData, device: torch.device | None = None) -> dict[str, Any]:
    """slime's per-sample lists of `batch`: tokens (1-D tensors, prompt and response), total_lengths,
    response_lengths, loss_masks (float tensors) and each key of SLIME_KEYS whose column every sample has; the
    tensors on `device` (default: where they are, the CPU for those made here)."""
    tokens = [torch.tensor(t, device=device) for t in batch.tokens]
    data: dict[str, Any] = {
        "tokens": tokens,
        "total_lengths": [len(t) for t in tokens],
        "response_lengths": list(batch.response_lengths),
        "loss_masks": batch.masks(device),
    }
    for ours, theirs in SLIME_KEYS.items():
        column = getattr(batch, ours)
        if column and all(v is not None for v in column):
            data[theirs] = [torch.as_tensor(v, dtype=torch.float32, device=device) for v in column]
    return data


def apply_slime_lists(data: dict[str, Any], batch: TrainData, flag: str) -> TrainData:
    """`batch` with slime's writable lists of `data` in its columns, checked: one value per response token for
    each sample (a ValueError names `flag`)."""
    changed: dict[str, list[Any]] = {}
    for key in SLIME_WRITABLE:
        if key not in data:
            continue
        values = data[key]
        if len(values) != len(batch):
            raise ValueError(f"{flag}: rollout_data[{key!r}] has {len(values)} entries for {len(batch)} samples")
        column = []
        for n, value in zip(batch.response_lengths, values, strict=True):
            value = torch.as_tensor(value, dtype=torch.float32)
            if value.shape != (n,):
                raise ValueError(
                    f"{flag}: rollout_data[{key!r}] entries must have one value per response token ({n}), got "
                    f"shape {tuple(value.shape)}"
                )
            column.append(value.tolist() if key == "loss_masks" else value)  # loss masks are lists, as built
        changed[key] = column
    return replace(batch, **changed)
