"""Loss aggregation: how per-token losses of one optimizer step become one number.

With l_it the loss of token t of sequence i, m_it its loss mask, B the sequences of the step that
have at least one loss token and N = sum_it m_it, each mode is sum_it c_it * m_it * l_it with:
- token-mean:              c = 1 / N                (DAPO's token-level loss; Yu et al., 2025)
- seq-mean-token-sum:      c = 1 / B
- seq-mean-token-mean:     c = 1 / (B * n_i)        (GRPO's objective; Shao et al., 2024,
                                                     "DeepSeekMath", eq. 3; n_i = sum_t m_it)
- seq-mean-token-sum-norm: c = 1 / (B * L)          (Dr.GRPO's constant normaliser, L = the
                                                     generation budget --rollout-max-response-len;
                                                     Liu et al., 2025, "Understanding R1-Zero-Like
                                                     Training: A Critical Perspective", arXiv:2503.20783)
B and N are counted over the whole step (each data-parallel rank passes the step's totals with its own rows), so
each micro-batch's share sum_t c_it * m_it * l_it adds up to the same objective whatever the data-parallel split.
"""

from __future__ import annotations

import torch

from slime_like.trainer.algorithms.names import AGG_MODES


def token_weights(
    masks: list[torch.Tensor],
    mode: str,
    max_response_len: int | None = None,
    totals: tuple[int, float] | None = None,
) -> list[torch.Tensor]:
    """Per-token coefficients c_it * m_it of one step's sequences for the aggregation `mode`; `totals` are the
    step's (B, N) when `masks` are only part of it (this rank's rows), else they are counted from `masks`."""
    counts = [float(m.sum()) for m in masks]
    seqs, tokens = totals if totals is not None else (sum(c > 0 for c in counts), sum(counts))
    num_seqs = max(1, seqs)
    if mode == "token-mean":
        total = max(1.0, tokens)
        return [m / total for m in masks]
    if mode == "seq-mean-token-sum":
        return [m / num_seqs for m in masks]
    if mode == "seq-mean-token-mean":
        return [m / (num_seqs * max(1.0, c)) for m, c in zip(masks, counts, strict=True)]
    if mode == "seq-mean-token-sum-norm":
        if not max_response_len:
            raise ValueError("--loss-agg-mode seq-mean-token-sum-norm needs --rollout-max-response-len")
        return [m / (num_seqs * max_response_len) for m in masks]
    raise ValueError(f"--loss-agg-mode {mode!r}: choose one of {AGG_MODES}")
