"""Supervised fine-tuning through the RL engine: negative log-likelihood of the loss-masked tokens.

    loss = -sum_it c_it * m_it * log pi(y_it)
with the same aggregation coefficients c as the policy loss (aggregation.py; token-mean by default)
and m the loss mask. The samples come from `plugins/sft_generate.py`, which builds each one from its
data row and masks everything but the assistant's tokens; run with
`--loss-type sft_loss --custom-generate-function-path plugins.sft_generate.generate`.
"""

from __future__ import annotations

import torch


def sft_token_loss(log_probs: torch.Tensor) -> torch.Tensor:
    """Per-token negative log-likelihood."""
    return -log_probs
