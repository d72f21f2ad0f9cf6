"""Advantage estimators by name (--advantage-estimator), and the custom-advantage hook's contract.

- grpo, gspo, cispo: the group-normalised reward on every token (grpo.py; Dr.GRPO without std; the raw
  reward with --disable-rewards-normalization, which also drops reinforce_plus_plus_baseline's baseline).
- rloo: reward minus the leave-one-out mean of its group (rloo.py).
- reinforce_plus_plus(_baseline): KL-shaped token returns, whitened over the batch (reinforce_pp.py).
- ppo: GAE on KL-shaped token rewards with the critic's values; returns are the critic's targets (ppo.py).
With --use-opd every estimator's (and a custom one's) advantages also take the teacher's reverse KL penalty
(opd.py). With --normalize-advantages the result is then whitened over all loss-masked tokens of the rollout
(REINFORCE++ always is). Rewards arrive with DAPO's overlong penalty already added.

Group baselines need every sample of a group, and a group may span data-parallel ranks: the rollout side computes
them before the split (buffer/group_rewards.py) and each rank's inputs carry its samples' `baselined` rewards. A rank
holds only its share of the rollout (RolloutScope): whitening sums are gathered over the ranks.

A custom estimator (--custom-advantage-function-path pkg.module.fn) has the signature
    fn(args: argparse.Namespace, inputs: AdvantageInputs) -> list[torch.Tensor] | Advantages
returning one float tensor of response length per sample (advantage 0 where the loss mask is 0).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from buffer.group_rewards import RewardShaping
from slime_like.trainer.algorithms.kl import kl_estimate
from slime_like.trainer.algorithms.names import ESTIMATORS
from slime_like.trainer.algorithms.opd import opd_advantages
from slime_like.trainer.algorithms.ppo import gae
from slime_like.trainer.algorithms.reinforce_pp import reinforce_pp_advantages
from slime_like.trainer.algorithms.returns import RowGather, _whole, masked_whiten, shaped_token_rewards


@dataclass
class AdvantageInputs:
    """What an estimator may read, one entry per sample; tensors cover the response tokens."""

    rewards: list[float]  # task reward plus the overlong penalty
    group_ids: list[int]  # samples of the same prompt share a group id
    loss_masks: list[torch.Tensor]  # 1.0 on tokens the policy produced and is trained on
    log_probs: list[torch.Tensor]  # the old policy's (Megatron, before this rollout's updates)
    ref_log_probs: list[torch.Tensor] | None = None  # the reference snapshot's, when a KL term is on
    rollout_log_probs: list[torch.Tensor | None] | None = None  # SGLang's, where the sample has them
    values: list[torch.Tensor] | None = None  # the critic's (ppo)
    # Rewards a slime reward post-process already normalised: grpo/gspo/cispo take them as the advantage and
    # reinforce_plus_plus_baseline skips its group baseline (what slime's post-process replaces).
    rewards_normalized: bool = False
    teacher_log_probs: list[torch.Tensor] | None = None  # --use-opd: the teacher's, of the sampled tokens
    tokens: list[list[int]] | None = None  # prompt and response (slime's advantage functions read them)
    # The rewards after the estimator's group baseline, computed where the whole group is (the rollout side:
    # buffer.group_rewards). None: computed here from rewards and group_ids, which must then cover whole groups.
    baselined: list[float] | None = None


@dataclass
class RolloutScope:
    """AdvantageInputs' samples are one data-parallel rank's share of the rollout (their groups may span ranks:
    the inputs must carry their `baselined` rewards)."""

    gather: RowGather  # per-row values of this rank's rows -> those of every row, in rollout order


@dataclass
class Advantages:
    """Per-sample token advantages, and the critic's regression targets for ppo."""

    advantages: list[torch.Tensor]
    returns: list[torch.Tensor] | None = None
    opd_reverse_kl: list[torch.Tensor] | None = None  # --use-opd: log pi_old - log pi_teacher per token


def _broadcast(scalars: list[float], masks: list[torch.Tensor]) -> list[torch.Tensor]:
    # m * a multiplies by a as a float32, as full_like(m, a) * m did, bit for bit, in one operation, not two.
    return [m * a for a, m in zip(scalars, masks, strict=True)]


def _kls(inputs: AdvantageInputs, kl_coef: float) -> list[torch.Tensor] | None:
    """k1 = log pi_old - log pi_ref per token, when --kl-coef shapes the rewards."""
    if not kl_coef:
        return None
    if inputs.ref_log_probs is None:
        raise ValueError("--kl-coef needs the reference log-probs")
    return [kl_estimate(lp, ref, "k1") for lp, ref in zip(inputs.log_probs, inputs.ref_log_probs, strict=True)]


def compute_advantages(
    args: Any, inputs: AdvantageInputs, custom: Callable[..., Any] | None = None, scope: RolloutScope | None = None
) -> Advantages:
    """Advantages (and ppo returns) of one rollout for --advantage-estimator, or the custom hook's (which sees
    the whole rollout: no scope). With a scope the inputs are one rank's share of the rollout."""
    masks = inputs.loss_masks
    if custom is not None and scope is not None:
        raise ValueError("a custom advantage function takes the whole rollout, not a rank's share")
    gather = scope.gather if scope is not None else _whole
    if custom is not None:
        out = custom(args, inputs)
        result = out if isinstance(out, Advantages) else Advantages(list(out))
    else:
        result = _builtin(args, inputs, scope)
    if getattr(args, "use_opd", False):
        if inputs.teacher_log_probs is None:
            raise ValueError(
                "--use-opd needs each sample's teacher_log_probs: with --opd-type sglang a reward post-process sets "
                "them (slime.rollout.on_policy_distillation.post_process_rewards, with its reward_func as "
                "--custom-rm-path and the teacher server as --rm-url)"
            )
        result.advantages, result.opd_reverse_kl = opd_advantages(
            result.advantages, inputs.log_probs, inputs.teacher_log_probs, masks, args.opd_kl_coef
        )
    if args.normalize_advantages and not args.advantage_estimator.startswith("reinforce_plus_plus"):
        result.advantages = masked_whiten(result.advantages, masks, gather=gather)
    return result


def _baselined(args: Any, inputs: AdvantageInputs, scope: RolloutScope | None) -> list[float]:
    """The inputs' rewards after the estimator's group baseline: shipped with them, or (the whole rollout held
    here) computed from their groups."""
    if inputs.baselined is not None:
        return inputs.baselined
    if scope is not None:
        raise ValueError(
            "a rank's share of the rollout carries no baselined rewards: the rollout side computes the group "
            "baselines before the split (buffer.group_rewards.shape_rewards)"
        )
    shaping = RewardShaping.from_args(args)
    return shaping.baselined(inputs.rewards, inputs.group_ids, inputs.rewards_normalized)


def _builtin(args: Any, inputs: AdvantageInputs, scope: RolloutScope | None = None) -> Advantages:
    name, masks, rewards = args.advantage_estimator, inputs.loss_masks, inputs.rewards
    gather = scope.gather if scope is not None else _whole
    if name in ("grpo", "gspo", "cispo", "rloo"):  # the baselined reward is the advantage, on every token
        return Advantages(_broadcast(_baselined(args, inputs, scope), masks))
    kls = _kls(inputs, args.kl_coef)
    if name in ("reinforce_plus_plus", "reinforce_plus_plus_baseline"):
        if name == "reinforce_plus_plus_baseline":
            rewards = _baselined(args, inputs, scope)  # the group baseline, before the token returns
        advantages, returns = reinforce_pp_advantages(rewards, masks, kls, args.kl_coef, args.gamma, gather=gather)
        return Advantages(advantages, returns)
    if name == "ppo":
        if inputs.values is None:
            raise ValueError("--advantage-estimator ppo needs the critic's values")
        pairs = [
            gae(shaped_token_rewards(r, m, None if kls is None else kls[i], args.kl_coef), v, m, args.gamma, args.lambd)
            for i, (r, m, v) in enumerate(zip(rewards, masks, inputs.values, strict=True))
        ]
        return Advantages([a for a, _ in pairs], [r for _, r in pairs])
    raise ValueError(f"--advantage-estimator {name!r}: choose one of {ESTIMATORS}")
