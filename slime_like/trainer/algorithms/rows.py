"""The per-sample training row a loss reads, its fields declared once, and its one mapping to slime's keys.

A trainer rank builds one row per sample of its share (rl_step.py); the engine hands a micro-batch's rows to
the loss function (loss.py), a custom loss gets them as they are. slime's hooks read the same data as per-sample
lists under slime's names (a loss's `batch`, `--rollout-data-postprocess-path`'s `rollout_data`): slime_lists
makes those from rows and apply_slime_lists writes back what slime lets a hook change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:  # torch is imported where rows are built: argument parsing imports this module
    from torch import Tensor


class TrainRow(TypedDict, total=False):
    """One sample's training data; per-token tensors cover the response tokens."""

    response_length: int  # every row
    loss_mask: Tensor  # every row
    old_log_probs: Tensor  # RL: the old policy's (or SGLang's, with --use-rollout-logprobs)
    advantages: Tensor  # RL
    ref_log_probs: Tensor  # a KL term is on
    is_weight: Tensor  # an off-policy correction is on
    old_values: Tensor  # ppo: the critic's values
    returns: Tensor  # ppo: the critic's targets
    # Read by slime's hooks only (StepHooks.row_fields, step_hooks.py):
    tokens: Tensor  # prompt and response
    total_length: int
    rollout_log_probs: Tensor  # SGLang's, where the sample has them
    # Set per optimizer step (rl_step.py): the aggregation weights of --loss-agg-mode and of the token-mean metrics.
    token_weight: Tensor
    metric_weight: Tensor


# Row fields -> slime's per-sample keys; each but response_lengths is handed to a slime hook when every row has it.
SLIME_KEYS = {
    "loss_mask": "loss_masks",
    "old_log_probs": "log_probs",
    "advantages": "advantages",
    "ref_log_probs": "ref_log_probs",
    "rollout_log_probs": "rollout_log_probs",
    "returns": "returns",
    "old_values": "values",
}
# What slime lets a --rollout-data-postprocess-path hook change: it trains (slime's keys -> row fields).
SLIME_WRITABLE = {"loss_masks": "loss_mask", "advantages": "advantages"}


def slime_lists(rows: Sequence[TrainRow], tokens: Sequence[Tensor]) -> dict[str, Any]:
    """slime's per-sample lists of `rows`: `tokens` (one 1-D tensor per row, prompt and response), total_lengths,
    response_lengths and each key of SLIME_KEYS whose field every row has."""
    data: dict[str, Any] = {
        "tokens": list(tokens),
        "total_lengths": [len(t) for t in tokens],
        "response_lengths": [r["response_length"] for r in rows],
    }
    for ours, theirs in SLIME_KEYS.items():
        if rows and all(ours in r for r in rows):
            data[theirs] = [r[ours] for r in rows]  # type: ignore[literal-required]
    return data


def apply_slime_lists(data: dict[str, Any], rows: Sequence[TrainRow], flag: str) -> None:
    """Write slime's writable lists of `data` back into `rows`, checked: one float tensor per row, one value per
    response token (a ValueError names `flag`)."""
    import torch

    for theirs, ours in SLIME_WRITABLE.items():
        if theirs not in data:
            continue
        values = data[theirs]
        if len(values) != len(rows):
            raise ValueError(f"{flag}: rollout_data[{theirs!r}] has {len(values)} entries for {len(rows)} samples")
        for row, value in zip(rows, values, strict=True):
            value = torch.as_tensor(value, dtype=torch.float32)
            if value.shape != (row["response_length"],):
                raise ValueError(
                    f"{flag}: rollout_data[{theirs!r}] entries must have one value per response token "
                    f"({row['response_length']}), got shape {tuple(value.shape)}"
                )
            row[ours] = value  # type: ignore[literal-required]
