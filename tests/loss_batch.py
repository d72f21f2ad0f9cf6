"""Hand-made training batches for the loss tests: the columns the trainer fills for a micro-batch."""

from __future__ import annotations

import torch

from buffer.train_data import TrainData
from slime_like.trainer.algorithms.aggregation import token_weights


def loss_batch(
    masks: list[torch.Tensor], mode: str = "token-mean", total_lengths: list[int] | None = None, **columns: list
) -> TrainData:
    """One sample per response mask (prompt of one token, or up to `total_lengths`), weighted by `mode` (metrics by
    token mean), with `columns` (TrainData's per-token columns) as given."""
    totals = total_lengths or [len(m) + 1 for m in masks]
    return TrainData(
        tokens=[[0] * n for n in totals],
        response_lengths=[len(m) for m in masks],
        loss_masks=[m.tolist() for m in masks],
        token_weights=list(token_weights(masks, mode)),
        metric_weights=list(token_weights(masks, "token-mean")),
        **columns,
    )
