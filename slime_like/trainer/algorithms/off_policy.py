"""Off-policy and train/inference mismatch corrections, as per-token weights on the policy loss.

The tokens were sampled by the behaviour policy mu (SGLang's log-probs, one weight version stale in
the one-step-ahead async loop; under --fully-async up to --max-weight-staleness versions, and one
sample's tokens may come from several versions: each token's log-prob is the one its version gave,
as recorded), while the PPO ratio is centred on the proximal policy pi_old (Megatron's recomputed
log-probs at the start of the rollout's training). With
rho_t = pi_old(y_t) / mu(y_t), each correction multiplies the per-token loss by a detached weight:
- Truncated IS (--use-tis; Yao et al., 2025, "Your Efficient RL Framework Secretly Brings You
  Off-Policy RL Training"): w_t = clip(rho_t, C_low, C_high).
- Masked IS (--use-mis; Liu et al., 2025, "When Speed Kills Stability: Demystifying RL Collapse
  from the Training-Inference Mismatch"): w = rho * 1[low <= rho <= high], with rho taken per token,
  per sequence (the product of the token ratios) or as the sequence's geometric mean, so a token or
  a whole sequence whose ratio leaves the band is dropped rather than down-weighted.
- Decoupled PPO (--use-decoupled-loss; Fu et al., 2025, "AReaL: A Large-Scale Asynchronous
  Reinforcement Learning System for Language Reasoning"): the clipped objective around the
  proximal policy, times rho_t; tokens with rho_t above --behav-imp-weight-cap are dropped. It is
  token-level MIS with the band [0, cap].
Dropped tokens keep their place in the loss normaliser (they contribute zero), as in AReaL.

Mismatch metrics between pi_old and mu, from samples of mu: the mean |log pi_old - log mu|, the KL
estimate KL(mu || pi_old) by k3 (exp(d) - 1 - d with d = log pi_old - log mu, unbiased and >= 0),
and the share of tokens with rho outside the band.
"""

from __future__ import annotations

import math

import torch

from slime_like.trainer.algorithms.names import MIS_LEVELS


def tis_weights(log_ratio: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Truncated importance weights clip(exp(log_ratio), low, high), detached."""
    return torch.clamp(torch.exp(log_ratio.detach()), low, high)


def mis_weights(log_ratio: torch.Tensor, mask: torch.Tensor, level: str, low: float, high: float) -> torch.Tensor:
    """Masked importance weights of one sequence: rho where rho is inside [low, high], else 0."""
    log_ratio = log_ratio.detach()
    if level == "token":
        rho = torch.exp(log_ratio)
    elif level in ("sequence", "geometric"):
        total = (log_ratio * mask).sum()
        if level == "geometric":
            total = total / mask.sum().clamp(min=1.0)
        # The product of many ratios can overflow: clamp the log before exponentiating.
        rho = torch.exp(torch.clamp(total, max=math.log(1e30))).expand_as(log_ratio)
    else:
        raise ValueError(f"--mis-level {level!r}: choose one of {MIS_LEVELS}")
    inside = (rho >= low) & (rho <= high)
    return torch.where(inside, rho, torch.zeros_like(rho))


def decoupled_weights(log_ratio: torch.Tensor, cap: float | None) -> torch.Tensor:
    """AReaL's behaviour importance weights pi_prox / mu, zero where they exceed `cap`."""
    rho = torch.exp(log_ratio.detach())
    if cap is None:
        return rho
    return torch.where(rho <= cap, rho, torch.zeros_like(rho))


MISMATCH_KEYS = ("abs_diff", "kl", "out_of_band")  # mismatch_terms' order


def mismatch_terms(
    train_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, mask: torch.Tensor, low: float, high: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per masked token: |d|, the k3 KL(mu || pi) term and the out-of-band indicator (element-wise, so one call
    covers any number of samples laid end to end)."""
    d = (train_log_probs - rollout_log_probs).float()
    rho = torch.exp(d)
    return d.abs() * mask, (rho - 1 - d) * mask, ((rho < low) | (rho > high)).float() * mask


def mismatch_sums(
    train_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, mask: torch.Tensor, low: float, high: float
) -> dict[str, float]:
    """Sums over one sample's masked tokens of |d|, k3 KL(mu || pi) and out-of-band indicators."""
    terms = mismatch_terms(train_log_probs, rollout_log_probs, mask, low, high)
    return {key: float(t.sum()) for key, t in zip(MISMATCH_KEYS, terms, strict=True)}
