"""The engine's loss functions: policy (PPO / GSPO / CISPO with KL, entropy, IS weights), value, SFT, custom.

Each returns its micro-batch's share of the step's objective, sum_it c_it * l_it over the
micro-batch's samples, with c the aggregation coefficients ("token_weight", already times the loss
mask) that the trainer computed on the whole step (aggregation.py). Metrics are shares as well,
weighted by "metric_weight" (token-mean), so the engine's sums over micro-batches and DP ranks are
the step's token means. Rows (one dict per sample, rows.TrainRow) carry response_length, loss_mask, token_weight,
metric_weight, old_log_probs, advantages and, when used, is_weight and ref_log_probs; a critic's
rows carry old_values and returns.

Per token, the policy loss is  l = w * o * pg + kl_loss_coef * KL(pi || pi_ref) - entropy_coef * H
with pg the objective of --advantage-estimator (ppo_clip_loss, gspo_loss or cispo_loss), w the
off-policy weight (off_policy.py, or slime's --custom-tis-function-path; 1 without a correction), o
OPSM's keep mask (opsm.py; 1 without --use-opsm) and KL by --kl-loss-type (kl.py, times pi/pi_old with
--use-unbiased-kl). slime's --custom-pg-loss-reducer-function-path replaces the aggregation of the
w * o * pg term only, as in slime.

A custom loss (--loss-type custom_loss --custom-loss-function-path pkg.module.fn) has the signature
    fn(args, log_probs: list[Tensor], entropy: list[Tensor], rows: list[dict])
        -> list[Tensor] | tuple[list[Tensor], dict[str, list[Tensor]]]
log_probs and entropy cover each sample's response tokens and carry gradients; it returns per-token
losses (masked and aggregated by the engine as above) and optionally per-token metrics, logged as
token means.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from slime_like.trainer.algorithms.cispo import cispo_loss
from slime_like.trainer.algorithms.gspo import gspo_loss
from slime_like.trainer.algorithms.kl import kl_estimate
from slime_like.trainer.algorithms.opsm import opsm_keep
from slime_like.trainer.algorithms.policy_loss import PolicyLossOutput, ppo_clip_loss
from slime_like.trainer.algorithms.ppo import value_loss
from slime_like.trainer.algorithms.rows import TrainRow
from slime_like.trainer.algorithms.sft import sft_token_loss

Rows = list[TrainRow]
LossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]
# slime's TIS function and pg-loss reducer, adapted (slime_contract.slime_pg_hooks); None where unset.
PgHooks = tuple[Callable[..., Any] | None, Callable[..., Any] | None]


def _share(x: torch.Tensor, weight: torch.Tensor) -> float:
    return float((x.detach() * weight).sum())


def policy_objective(
    args: Any, log_probs: torch.Tensor, flat: dict[str, torch.Tensor], lengths: list[int]
) -> PolicyLossOutput:
    """Per-token policy-gradient loss for --advantage-estimator of concatenated responses of `lengths`."""
    old, adv = flat["old_log_probs"], flat["advantages"]
    if args.advantage_estimator == "gspo":
        mask = flat["loss_mask"]
        return gspo_loss(log_probs, old, adv, mask, args.eps_clip, args.eps_clip_high, args.eps_clip_c, lengths)
    if args.advantage_estimator == "cispo":
        return cispo_loss(log_probs, old, adv, args.eps_clip, args.eps_clip_high)
    return ppo_clip_loss(log_probs, old, adv, args.eps_clip, args.eps_clip_high, args.eps_clip_c)


def _concat(rows: Rows, keys: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """The rows' per-token tensors of `keys` (those present in the rows), concatenated in row order."""
    return {k: torch.cat([r[k] for r in rows]) for k in keys if k in rows[0]}


def policy_loss_fn(args: Any, pg_hooks: PgHooks | None = None) -> LossFn:
    """Loss function of a policy step: clipped objective, OPSM, IS weights, KL loss and entropy bonus.

    The micro-batch's responses are concatenated into one flat tensor so every term is a handful of
    vector operations and each metric one reduction (a per-sample loop cost ~10% of a CPU step).
    slime's TIS function and pg-loss reducer hooks, when given, take the policy-gradient term's place
    in that chain: `pg_hooks`, as step_hooks.py loads them (loaded from `args` here when not given).
    """
    keys = ("old_log_probs", "advantages", "loss_mask", "token_weight", "metric_weight", "is_weight", "ref_log_probs")
    if pg_hooks is None:
        from slime_like.trainer.algorithms.slime_contract import slime_pg_hooks

        pg_hooks = slime_pg_hooks(args)
    tis_hook, reducer_hook = pg_hooks
    opsm, unbiased_kl = getattr(args, "use_opsm", False), getattr(args, "use_unbiased_kl", False)

    def loss_fn(log_probs: list[torch.Tensor], rows: Rows, entropy: list[torch.Tensor]):
        lengths = [r["response_length"] for r in rows]
        lp = torch.cat([x[-n:] for x, n in zip(log_probs, lengths, strict=True)])
        ent = torch.cat([x[-n:] for x, n in zip(entropy, lengths, strict=True)])
        flat = _concat(rows, keys)
        mw, weight = flat["metric_weight"], flat["token_weight"]
        out = policy_objective(args, lp, flat, lengths)
        pg, pg_weight, extra = out.loss, weight, {}
        if opsm:
            keep = opsm_keep(lp, flat["old_log_probs"], flat["advantages"], flat["loss_mask"], lengths, args.opsm_delta)
            pg = pg * keep
            extra["opsm_clipfrac"] = _share(1.0 - keep, mw)
        if tis_hook is not None:
            pg, kept, tis_metrics = tis_hook(pg, rows)
            pg_weight = weight * kept  # rejected tokens leave the sum; the normaliser stays (slime)
            extra.update({k: _share(torch.as_tensor(v, dtype=torch.float32), mw) for k, v in tis_metrics.items()})
        elif "is_weight" in flat:
            pg = pg * flat["is_weight"]
        if reducer_hook is not None:
            kept_mask = flat["loss_mask"] * kept if tis_hook is not None else flat["loss_mask"]
            total = reducer_hook(pg, rows, list(kept_mask.split(lengths)), weight)
        else:
            total = (pg * pg_weight).sum()
        stats = {
            "pg_loss": _share(pg, mw),
            "pg_clipfrac": _share(out.clipped, mw),
            "pg_dual_clipfrac": _share(out.dual_clipped, mw),
            "ppo_kl": _share(flat["old_log_probs"] - lp, mw),
            "ppo_ratio_abs_dev": _share((out.ratio - 1).abs(), mw),
            "entropy": _share(ent, mw),
            **extra,
        }
        rest = -args.entropy_coef * ent if args.entropy_coef else None
        if args.use_kl_loss:
            # --use-unbiased-kl: weigh by pi / pi_old with its gradient, as slime (kl.py).
            ratio = torch.exp(lp - flat["old_log_probs"]) if unbiased_kl else None
            kl = kl_estimate(lp, flat["ref_log_probs"], args.kl_loss_type, ratio)
            rest = args.kl_loss_coef * kl if rest is None else rest + args.kl_loss_coef * kl
            stats["kl_loss"] = _share(kl, mw)
        else:
            stats["kl_loss"] = 0.0
        if rest is not None:
            total = total + (rest * weight).sum()
        return total, stats

    return loss_fn


def custom_loss_fn(args: Any, fn: Callable[..., Any]) -> LossFn:
    """Loss function around a user's per-token loss (--custom-loss-function-path)."""

    def loss_fn(log_probs: list[torch.Tensor], rows: Rows, entropy: list[torch.Tensor]):
        resp = [lp[-r["response_length"] :] for lp, r in zip(log_probs, rows, strict=True)]
        ents = [e[-r["response_length"] :] for e, r in zip(entropy, rows, strict=True)]
        out = fn(args, resp, ents, rows)
        losses, extra = out if isinstance(out, tuple) else (out, {})
        total = sum((loss * r["token_weight"]).sum() for loss, r in zip(losses, rows, strict=True))
        stats = {
            k: sum(_share(v, r["metric_weight"]) for v, r in zip(vs, rows, strict=True)) for k, vs in extra.items()
        }
        return total, stats

    return loss_fn


def sft_loss_fn() -> LossFn:
    """Loss function of an SFT step: negative log-likelihood of the loss-masked tokens."""

    def loss_fn(log_probs: list[torch.Tensor], rows: Rows):
        total = log_probs[0].new_zeros(())
        nll = 0.0
        for lp, row in zip(log_probs, rows, strict=True):
            per_token = sft_token_loss(lp[-row["response_length"] :])
            total = total + (per_token * row["token_weight"]).sum()
            nll += _share(per_token, row["metric_weight"])
        return total, {"sft_nll": nll}

    return loss_fn


def value_loss_fn(args: Any) -> LossFn:
    """Loss function of a critic step: clipped value regression on the GAE returns (token-mean)."""

    def loss_fn(values: list[torch.Tensor], rows: Rows):
        total = values[0].new_zeros(())
        stats = {"value_loss": 0.0, "value_clipfrac": 0.0, "values": 0.0}
        for v, row in zip(values, rows, strict=True):
            v = v[-row["response_length"] :]
            loss, clipped = value_loss(v, row["old_values"], row["returns"], args.value_clip)
            total = total + (loss * row["metric_weight"]).sum()
            stats["value_loss"] += _share(loss, row["metric_weight"])
            stats["value_clipfrac"] += _share(clipped, row["metric_weight"])
            stats["values"] += _share(v, row["metric_weight"])
        return total, stats

    return loss_fn
