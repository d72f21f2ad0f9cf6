"""Off-policy sequence masking (OPSM), as slime's --use-opsm.

From DeepSeek-V3.2 (DeepSeek-AI, 2025, "DeepSeek-V3.2: Pushing the Frontier of Open Large Language
Models", section on keeping RL stable): a sequence with a negative advantage whose policy has drifted
from the one that scored it is dropped from the policy-gradient loss. The drift of sequence i is the
mean over its loss tokens of log pi_old - log pi (the current policy); with delta = --opsm-delta,
token t of sequence i is masked when A_it < 0 and drift_i > delta. Positive-advantage tokens are
always kept: learning from good samples is safe even off-policy.
"""

from __future__ import annotations

import torch


def opsm_keep(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    lengths: list[int],
    delta: float,
) -> torch.Tensor:
    """Per-token 1/0 keep mask of concatenated responses of `lengths` (no gradient flows through it)."""
    diff = (old_log_probs - log_probs.detach()) * loss_mask
    drift = torch.cat(
        [
            (d.sum() / m.sum().clamp(min=1.0)).expand(n)
            for d, m, n in zip(diff.split(lengths), loss_mask.split(lengths), lengths, strict=True)
        ]
    )
    return 1.0 - ((advantages < 0) & (drift > delta)).float()
