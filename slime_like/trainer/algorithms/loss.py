"""The engine's loss functions: policy (PPO / GSPO / CISPO with KL, entropy, IS weights), value, SFT, custom.

Each returns its micro-batch's share of the step's objective, sum_it c_it * l_it over the
micro-batch's samples, with c the aggregation coefficients (`token_weights`, already times the loss
mask) that the trainer computed on the whole step (aggregation.py). Metrics are shares as well,
weighted by `metric_weights` (token-mean), so the engine's sums over micro-batches and DP ranks are
the step's token means. A loss function gets its micro-batch as the training batch itself (buffer.train_data.
TrainData, the micro-batch's rows): response_lengths, loss_masks, token_weights, metric_weights, old_log_probs,
advantages and, when used, is_weights and ref_log_probs; a critic's loss reads old_values and returns.

Per token, the policy loss is  l = w * o * pg + kl_loss_coef * KL(pi || pi_ref) - entropy_coef * H
with pg the objective of --advantage-estimator (ppo_clip_loss, gspo_loss or cispo_loss), w the
off-policy weight (off_policy.py, or slime's --custom-tis-function-path; 1 without a correction), o
OPSM's keep mask (opsm.py; 1 without --use-opsm) and KL by --kl-loss-type (kl.py, times pi/pi_old with
--use-unbiased-kl). slime's --custom-pg-loss-reducer-function-path replaces the aggregation of the
w * o * pg term only, as in slime.

A custom loss (--loss-type custom_loss --custom-loss-function-path pkg.module.fn) has the signature
    fn(args, log_probs: list[Tensor], entropy: list[Tensor], batch: TrainData)
        -> list[Tensor] | tuple[list[Tensor], dict[str, list[Tensor]]]
log_probs and entropy cover each sample's response tokens and carry gradients; it returns per-token
losses (masked and aggregated by the engine as above) and optionally per-token metrics, logged as
token means.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from buffer.train_data import TrainData
from slime_like.trainer.algorithms.cispo import cispo_loss
from slime_like.trainer.algorithms.gspo import gspo_loss
from slime_like.trainer.algorithms.kl import kl_estimate
from slime_like.trainer.algorithms.opsm import opsm_keep
from slime_like.trainer.algorithms.policy_loss import PolicyLossOutput, ppo_clip_loss
from slime_like.trainer.algorithms.ppo import value_loss
from slime_like.trainer.algorithms.sft import sft_token_loss

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


def _concat(micro: TrainData, columns: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """The micro-batch's per-token tensors of `columns` (those filled), each concatenated in row order."""
    return {name: torch.cat(getattr(micro, name)) for name in columns if getattr(micro, name)}


def policy_loss_fn(args: Any, pg_hooks: PgHooks | None = None) -> LossFn:
    """Loss function of a policy step: clipped objective, OPSM, IS weights, KL loss and entropy bonus.

    The micro-batch's responses are concatenated into one flat tensor so every term is a handful of
    vector operations and each metric one reduction (a per-sample loop cost ~10% of a CPU step).
    slime's TIS function and pg-loss reducer hooks, when given, take the policy-gradient term's place
    in that chain: `pg_hooks`, as step_hooks.py loads them (loaded from `args` here when not given).
    """
    columns = ("old_log_probs", "advantages", "token_weights", "metric_weights", "is_weights", "ref_log_probs")
    if pg_hooks is None:
        from slime_like.trainer.algorithms.slime_contract import slime_pg_hooks

        pg_hooks = slime_pg_hooks(args)
    tis_hook, reducer_hook = pg_hooks
    opsm, unbiased_kl = getattr(args, "use_opsm", False), getattr(args, "use_unbiased_kl", False)

    def loss_fn(log_probs: list[torch.Tensor], micro: TrainData, entropy: list[torch.Tensor]):
        lengths = micro.response_lengths
        lp = torch.cat([x[-n:] for x, n in zip(log_probs, lengths, strict=True)])
        ent = torch.cat([x[-n:] for x, n in zip(entropy, lengths, strict=True)])
        flat = _concat(micro, columns)
        flat["loss_mask"] = torch.cat(micro.masks(lp.device))
        mw, weight = flat["metric_weights"], flat["token_weights"]
        out = policy_objective(args, lp, flat, lengths)
        pg, pg_weight, extra = out.loss, weight, {}
        if opsm:
            keep = opsm_keep(lp, flat["old_log_probs"], flat["advantages"], flat["loss_mask"], lengths, args.opsm_delta)
            pg = pg * keep
            extra["opsm_clipfrac"] = _share(1.0 - keep, mw)
        if tis_hook is not None:
            pg, kept, tis_metrics = tis_hook(pg, micro)
            pg_weight = weight * kept  # rejected tokens leave the sum; the normaliser stays (slime)
            extra.update({k: _share(torch.as_tensor(v, dtype=torch.float32), mw) for k, v in tis_metrics.items()})
        elif "is_weights" in flat:
            pg = pg * flat["is_weights"]
        if reducer_hook is not None:
            kept_mask = flat["loss_mask"] * kept if tis_hook is not None else flat["loss_mask"]
            total = reducer_hook(pg, micro, list(kept_mask.split(lengths)), weight)
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

    def loss_fn(log_probs: list[torch.Tensor], micro: TrainData, entropy: list[torch.Tensor]):
        resp = [lp[-n:] for lp, n in zip(log_probs, micro.response_lengths, strict=True)]
        ents = [e[-n:] for e, n in zip(entropy, micro.response_lengths, strict=True)]
        out = fn(args, resp, ents, micro)
        losses, extra = out if isinstance(out, tuple) else (out, {})
        total = sum((loss * w).sum() for loss, w in zip(losses, micro.token_weights, strict=True))
        stats = {k: sum(_share(v, w) for v, w in zip(vs, micro.metric_weights, strict=True)) for k, vs in extra.items()}
        return total, stats

    return loss_fn


def sft_loss_fn() -> LossFn:
    """Loss function of an SFT step: negative log-likelihood of the loss-masked tokens."""

    def loss_fn(log_probs: list[torch.Tensor], micro: TrainData):
        total = log_probs[0].new_zeros(())
        nll = 0.0
        for lp, n, w, mw in zip(
            log_probs, micro.response_lengths, micro.token_weights, micro.metric_weights, strict=True
        ):
            per_token = sft_token_loss(lp[-n:])
            total = total + (per_token * w).sum()
            nll += _share(per_token, mw)
        return total, {"sft_nll": nll}

    return loss_fn


def value_loss_fn(args: Any) -> LossFn:
    """Loss function of a critic step: clipped value regression on the GAE returns (token-mean)."""

    def loss_fn(values: list[torch.Tensor], micro: TrainData):
        total = values[0].new_zeros(())
        stats = {"value_loss": 0.0, "value_clipfrac": 0.0, "values": 0.0}
        per_sample = zip(
            values, micro.response_lengths, micro.old_values, micro.returns, micro.metric_weights, strict=True
        )
        for v, n, old, returns, mw in per_sample:
            v = v[-n:]
            loss, clipped = value_loss(v, old, returns, args.value_clip)
            total = total + (loss * mw).sum()
            stats["value_loss"] += _share(loss, mw)
            stats["value_clipfrac"] += _share(clipped, mw)
            stats["values"] += _share(v, mw)
        return total, stats

    return loss_fn
