"""Hand-made rows for the policy loss tests: the fields the trainer gives each sample."""

from __future__ import annotations

import torch

from slime_like.trainer.algorithms.aggregation import token_weights


def loss_rows(masks: list[torch.Tensor], mode: str = "token-mean", **extra: list) -> list[dict]:
    """One row per response mask, weighted by `mode` (metrics by token mean), with `extra` fields per row."""
    weights, metric = token_weights(masks, mode), token_weights(masks, "token-mean")
    rows = []
    for i, (m, w, mw) in enumerate(zip(masks, weights, metric, strict=True)):
        row = {"response_length": len(m), "loss_mask": m, "token_weight": w, "metric_weight": mw}
        row.update({k: v[i] for k, v in extra.items()})
        rows.append(row)
    return rows
