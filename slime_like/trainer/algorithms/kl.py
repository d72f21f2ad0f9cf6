"""Estimators of KL(pi || pi_ref) from samples of pi, per token.

With log-ratio d = log pi(a|s) - log pi_ref(a|s) for a ~ pi (John Schulman, "Approximating KL
Divergence", 2020): k1 = d (unbiased), k2 = d^2 / 2 (low variance, biased), k3 = exp(-d) - 1 + d
(unbiased, non-negative). `low_var_kl` is k3, the estimator of GRPO (Shao et al., 2024,
"DeepSeekMath", eq. 4), with its value clamped to [-10, 10] as slime and verl do (so a token whose
ratio has run away contributes at most 10 and no gradient). slime's default type is k1.

--use-unbiased-kl (DeepSeek-AI, 2025, "DeepSeek-V3.2", unbiased KL estimate): the samples come from
pi_old, not pi, so each token's estimate is weighted by the importance ratio pi / pi_old (with its
gradient), as slime does, before low_var_kl's clamp.
"""

from __future__ import annotations

import torch

from slime_like.trainer.algorithms.names import KL_TYPES


def kl_estimate(
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    kl_type: str,
    importance_ratio: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token KL estimate of the chosen type, times `importance_ratio` when given (before the clamp)."""
    d = log_probs - ref_log_probs
    if kl_type == "k1":
        kl = d
    elif kl_type == "k2":
        kl = 0.5 * d * d
    elif kl_type in ("k3", "low_var_kl"):
        kl = torch.exp(-d) - 1.0 + d
    else:
        raise ValueError(f"--kl-loss-type {kl_type!r}: choose one of {KL_TYPES}")
    if importance_ratio is not None:
        kl = importance_ratio * kl
    return torch.clamp(kl, -10.0, 10.0) if kl_type == "low_var_kl" else kl
