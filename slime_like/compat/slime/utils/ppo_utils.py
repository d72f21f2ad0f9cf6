"""slime.utils.ppo_utils: the KL estimators custom losses use."""

from __future__ import annotations

from typing import Any

import torch

from slime_like.trainer.algorithms.kl import kl_estimate


def compute_approx_kl(
    log_probs: torch.Tensor, log_probs_base: torch.Tensor, kl_loss_type: str, importance_ratio: Any = None
) -> torch.Tensor:
    """Per-token KL(pi || pi_base) estimate of type k1, k2, k3 or low_var_kl (optionally times a ratio)."""
    kl = kl_estimate(log_probs, log_probs_base, kl_loss_type)
    return kl * importance_ratio if importance_ratio is not None else kl
