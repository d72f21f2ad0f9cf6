"""The RL step's arithmetic on one data-parallel rank's share of a rollout, apart from the engines that run it.

Given the engines' forwards of the share (the old policy's log-probs, and the reference's, the critic's values,
the teacher's), RLStep computes advantages (advantages.py), off-policy weights (off_policy.py) and mismatch
metrics into the share's batch (its trainer columns: buffer.train_data.TrainData), then each optimizer step's rows
with their token weights of --loss-agg-mode (aggregation.py). The trainer rank (slime_like/trainer/actor.py) runs
the forwards and the train steps.

A rank holds only its share (buffer.train_data.RankShare): its rows, with their rewards already shaped on the
rollout side (the overlong penalty and the group baselines, buffer/group_rewards.py), and the rollout's size.
Whatever sums over the whole rollout or step (whitening, the aggregation's counts, metrics, the checks that every
sample has a column) gathers one number per sample over the DP ranks into rollout order (Collectives.rows), so every
rank adds the same numbers in the same order as a single process would, and a check fails alike on every rank.
Log-probs never leave their rank, except for a custom advantage function, which sees the whole rollout.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import partial
from itertools import accumulate
from typing import Any, Protocol

import torch

from buffer.group_rewards import RewardShaping
from buffer.train_data import RankShare, TrainData
from slime_like.trainer.algorithms.advantages import AdvantageInputs, Advantages, RolloutScope, compute_advantages
from slime_like.trainer.algorithms.aggregation import token_weights
from slime_like.trainer.algorithms.off_policy import decoupled_weights, mis_weights, mismatch_terms, tis_weights
from slime_like.trainer.algorithms.step_hooks import StepHooks
from slime_like.trainer.rollout_entropy import entropy_metrics


class Collectives(Protocol):
    """What the step needs of the data-parallel group."""

    def rows(self, share: RankShare, values: list[float]) -> list[float]:
        """One number per sample of `share` -> one per sample of the rollout, in rollout order (exact)."""
        ...

    def objects(self, obj: Any) -> list[Any]:
        """`obj` of every DP rank, in rank order."""
        ...


class OneRank:
    """The collectives of a data-parallel group of one rank."""

    def rows(self, share: RankShare, values: list[float]) -> list[float]:
        """This rank's numbers at their rows of the rollout, 0.0 elsewhere."""
        full = [0.0] * len(share.rollout)
        for row, value in zip(share.rows, values, strict=True):
            full[row] = float(value)
        return full

    def objects(self, obj: Any) -> list[Any]:
        """[obj]."""
        return [obj]


@dataclass
class Forwards:
    """The engines' outputs for a share's samples, each per sample over its response tokens."""

    old_log_probs: list[torch.Tensor]
    ref_log_probs: list[torch.Tensor] | None = None  # a KL term is on
    values: list[torch.Tensor] | None = None  # ppo's critic
    teacher_log_probs: list[torch.Tensor] | None = None  # --use-opd
    entropy: list[torch.Tensor] | None = None  # --use-rollout-entropy: the old policy's


def lacking(share: RankShare, collectives: Collectives, column: str) -> int:
    """How many of the rollout's samples have no `column` (None there, or no such column): each rank marks its own
    rows, one all-reduce adds the marks, and every rank gets the same count."""
    values = getattr(share.data, column) or [None] * len(share)
    return round(sum(collectives.rows(share, [float(v is None) for v in values])))


def every_sample(share: RankShare, collectives: Collectives, column: str, flag: str, hint: str) -> list[Any]:
    """This rank's values of a per-sample column `flag` needs, or an error (the same on every rank) naming the
    samples that lack it, gathered from their ranks, and how to fill it."""
    missing = lacking(share, collectives, column)
    if missing:
        values, names = getattr(share.data, column) or [None] * len(share), share.data.sample_indices or share.rows
        mine = [(row, names[i]) for i, (row, v) in enumerate(zip(share.rows, values, strict=True)) if v is None]
        indices = [index for _, index in sorted(pair for part in collectives.objects(mine) for pair in part)]
        raise ValueError(
            f"{flag}: {missing} of {len(share.rollout)} samples have no {column} (sample indices {indices[:8]}): {hint}"
        )
    return getattr(share.data, column)


class RLStep:
    """The trainer columns, step weights and metrics of one rank's share, for the run's arguments and hooks."""

    def __init__(self, args: Any, hooks: StepHooks, collectives: Collectives) -> None:
        self.args = args
        self.hooks = hooks
        self.collectives = collectives

    def rl_batch(self, share: RankShare, forwards: Forwards) -> tuple[TrainData, dict[str, float]]:
        """The share's batch with its old log-probs, advantages and off-policy weights, and the rollout's metrics."""
        args, data = self.args, share.data
        lengths = data.response_lengths
        masks = data.masks()
        old_lp, ref_lp, values = forwards.old_log_probs, forwards.ref_log_probs, forwards.values
        rollout_lp = [None if r is None else torch.tensor(r, dtype=torch.float32) for r in data.rollout_log_probs]
        if len(data.rewards) != len(data) or len(data.baselined_rewards) != len(data):
            raise ValueError(
                "a rank's share carries no shaped rewards: the rollout side shapes them before the split "
                "(buffer.group_rewards.shape_rewards)"
            )
        metrics: dict[str, float] = {}
        if args.overlong_buffer_len:  # the mean over the rollout of the penalty the rollout side added
            shaping = RewardShaping.from_args(args)
            every = self.collectives.rows(share, [shaping.penalty(n) for n in lengths])
            metrics["train/overlong_penalty_mean"] = sum(every) / max(1, len(every))
        normalized = share.rollout.rewards_normalized  # by a slime post-process
        inputs = AdvantageInputs(
            list(data.rewards), data.group_ids, masks, old_lp, ref_lp, rollout_lp, values, normalized,
            baselined=list(data.baselined_rewards),
        )  # fmt: skip
        if args.use_opd:
            inputs.teacher_log_probs = forwards.teacher_log_probs
        if self.hooks.advantage is not None:
            inputs.tokens = data.tokens
            result = self._custom_advantages(share, inputs)
        else:
            result = compute_advantages(args, inputs, None, RolloutScope(partial(self.collectives.rows, share)))
        if values is not None and result.returns is None:
            raise ValueError("--custom-advantage-function-path with ppo must return Advantages(advantages, returns)")
        without = lacking(share, self.collectives, "rollout_log_probs")  # samples SGLang gave no log-probs
        is_weights = self._is_weights(without, old_lp, rollout_lp, masks)
        old = (
            self._require_rollout(without, rollout_lp, "--use-rollout-logprobs")
            if args.use_rollout_logprobs
            else old_lp
        )
        if self.hooks.needs_rollout_log_probs:
            self._require_rollout(without, rollout_lp, self.hooks.needs_rollout_log_probs)
        batch = replace(
            data,
            old_log_probs=list(old),
            advantages=list(result.advantages),
            ref_log_probs=list(ref_lp or []),
            is_weights=list(is_weights or []),
            old_values=list(values or []),
            returns=list(result.returns or []) if values is not None else [],
            entropy=list(forwards.entropy or []),
        )
        with_lp = without < len(share.rollout)
        metrics.update(self._rollout_metrics(share, result.advantages, masks, old_lp, rollout_lp, is_weights, with_lp))
        if forwards.entropy is not None:
            metrics.update(entropy_metrics(forwards.entropy, partial(self.collectives.rows, share)))
        if result.opd_reverse_kl is not None:  # slime's opd_reverse_kl: mean over the loss tokens
            tokens = max(1.0, sum(self.collectives.rows(share, [float(m.sum()) for m in masks])))
            kl = sum(self.collectives.rows(share, [float(k.sum()) for k in result.opd_reverse_kl]))
            metrics["train/opd_reverse_kl"] = kl / tokens
        return batch, metrics

    def loss_tokens(self, share: RankShare, batch: TrainData) -> list[float]:
        """Loss tokens of every sample of the rollout, in rollout order: each step's aggregation counts them."""
        return self.collectives.rows(share, [float(sum(m)) for m in batch.loss_masks])

    def step_batch(self, batch: TrainData, counts: list[float], bounds: tuple[int, int]) -> TrainData:
        """`batch` (this rank's rows of one step) with its aggregation weights (--loss-agg-mode) and token-mean
        metric weights; `counts` are every sample's loss tokens (loss_tokens), `bounds` the step's rows of them."""
        step_counts = counts[bounds[0] : bounds[1]]
        totals = (sum(c > 0 for c in step_counts), sum(step_counts))
        masks = batch.masks()
        weights = token_weights(masks, self.args.loss_agg_mode, self.args.rollout_max_response_len, totals)
        metric = token_weights(masks, "token-mean", totals=totals)
        return replace(batch, token_weights=list(weights), metric_weights=list(metric))

    @staticmethod
    def step_means(step_metrics: list[dict[str, float]]) -> dict[str, float]:
        """The rollout's metrics of its steps': each step's mean, counts (`*skipped_steps`) summed."""
        metrics: dict[str, float] = {}
        for key in step_metrics[0] if step_metrics else ():
            total = sum(m[key] for m in step_metrics)
            metrics[key] = total if key.endswith("skipped_steps") else total / len(step_metrics)  # a count
        return metrics

    def _custom_advantages(self, share: RankShare, inputs: AdvantageInputs) -> Advantages:
        """A custom advantage function sees the whole rollout, as it did when every rank held it: with DP > 1 the
        ranks' inputs are gathered (log-probs included: the price of a hook written for the whole rollout), the
        hook runs on every rank alike, and each rank keeps its own samples' results."""
        if share.dp_size > 1:
            inputs = self._whole_inputs(share, inputs)
        result = compute_advantages(self.args, inputs, self.hooks.advantage)
        if share.dp_size == 1:
            return result

        def mine(column: list[torch.Tensor] | None) -> list[torch.Tensor] | None:
            return None if column is None else [column[r] for r in share.rows]

        return Advantages(mine(result.advantages), mine(result.returns), mine(result.opd_reverse_kl))  # type: ignore[arg-type]

    def _whole_inputs(self, share: RankShare, inputs: AdvantageInputs) -> AdvantageInputs:
        """Every rank's advantage inputs (tokens included), in rollout order."""
        parts = self.collectives.objects((share.rows, inputs))
        where = {row: (part, i) for part, (rows, _) in enumerate(parts) for i, row in enumerate(rows)}
        order = [where[row] for row in range(len(share.rollout))]

        def column(name: str) -> Any:
            if getattr(inputs, name) is None or not isinstance(getattr(inputs, name), list):
                return getattr(inputs, name)
            return [getattr(parts[p][1], name)[i] for p, i in order]

        return AdvantageInputs(**{f.name: column(f.name) for f in fields(AdvantageInputs)})

    def _require_rollout(self, missing: int, rollout_lp: list[torch.Tensor | None], flag: str) -> list[torch.Tensor]:
        """SGLang's log-probs of this rank's samples, or the same error on every rank if any of the rollout's
        `missing` samples lack them."""
        if missing:
            raise ValueError(f"{flag} needs SGLang's log-probs, but {missing} samples have none")
        return rollout_lp  # type: ignore[return-value]

    def _is_weights(
        self,
        missing: int,
        old_lp: list[torch.Tensor],
        rollout_lp: list[torch.Tensor | None],
        masks: list[torch.Tensor],
    ) -> list[torch.Tensor] | None:
        """Per-token off-policy weights pi_old / pi_rollout of the chosen correction (None: no correction)."""
        args = self.args
        if args.use_tis and not args.custom_tis_function_path:  # slime's TIS hook weighs inside the loss
            flag, weigh = "--use-tis", lambda d, m: tis_weights(d, args.tis_clip_low, args.tis_clip)
        elif args.use_mis:
            flag, weigh = "--use-mis", lambda d, m: mis_weights(d, m, args.mis_level, args.mis_low, args.mis_high)
        elif args.use_decoupled_loss:
            flag, weigh = "--use-decoupled-loss", lambda d, m: decoupled_weights(d, args.behav_imp_weight_cap)
        else:
            return None
        behaviour = self._require_rollout(missing, rollout_lp, flag)
        return [weigh(o - b, m) for o, b, m in zip(old_lp, behaviour, masks, strict=True)]

    def _rollout_metrics(
        self,
        share: RankShare,
        advantages: list[torch.Tensor],
        masks: list[torch.Tensor],
        old_lp: list[torch.Tensor],
        rollout_lp: list[torch.Tensor | None],
        is_weights: list[torch.Tensor] | None,
        with_rollout_lp: bool,
    ) -> dict[str, float]:
        """Advantage statistics, train/rollout mismatch (where SGLang gave log-probs) and IS weight use, over the
        whole rollout (sums of every rank's samples, added in rollout order)."""

        def total(values: list[float]) -> float:
            return sum(self.collectives.rows(share, values))

        # Each sample's sums, from whole-share tensors: a per-sample loop of small tensor operations cost ~20 ms
        # a rollout of 256 samples on a CPU, in the log-prob phase (per_sample_sums adds exactly as it did).
        lengths = [len(m) for m in share.data.loss_masks]  # `masks` as lists: no tensor call per sample
        mask = _flat(masks, lengths, "loss masks")
        adv = _flat(advantages, lengths, "advantages")
        columns = [mask, adv * mask]
        if with_rollout_lp:  # some sample of the rollout has SGLang's log-probs
            have = [r is not None for r in rollout_lp]
            behaviour = [torch.zeros_like(o) if r is None else r for o, r in zip(old_lp, rollout_lp, strict=True)]
            low, high = self.args.mis_low, self.args.mis_high
            columns += mismatch_terms(
                _flat(old_lp, lengths, "log-probs"), _flat(behaviour, lengths, "log-probs"), mask, low, high
            )
        if is_weights is not None:
            weights = _flat(is_weights, lengths, "IS weights")
            columns += [weights * mask, (weights == 0).float() * mask]
        sums = per_sample_sums(columns, lengths)
        counts = sums[0]
        tokens = max(1.0, total(counts))
        mean = total(sums[1]) / tokens
        var = total(per_sample_sums([((adv - mean) ** 2) * mask], lengths)[0]) / tokens
        metrics = {"train/advantage_mean": mean, "train/advantage_std": var**0.5}
        if with_rollout_lp:
            # A sample without SGLang's log-probs adds 0.0: the sums are those over the samples that have them.
            n = max(1.0, total([c if h else 0.0 for c, h in zip(counts, have, strict=True)]))
            for k, name in enumerate(("logprob_abs_diff", "kl", "out_of_band_frac")):
                values = [v if h else 0.0 for v, h in zip(sums[2 + k], have, strict=True)]
                metrics[f"train/train_rollout_{name}"] = total(values) / n
        if is_weights is not None:
            metrics["train/is_weight_mean"] = total(sums[-2]) / tokens
            metrics["train/is_dropped_frac"] = total(sums[-1]) / tokens
        return metrics


def _flat(tensors: list[torch.Tensor], lengths: list[int], what: str) -> torch.Tensor:
    """Per-sample tensors laid end to end, checked to cover `lengths` tokens in all."""
    flat = torch.cat(tensors) if tensors else torch.zeros(0)
    if flat.dim() != 1 or flat.shape[0] != sum(lengths):
        raise ValueError(f"{what}: one 1-D tensor per sample over its response tokens, {sum(lengths)} tokens in all")
    return flat


def per_sample_sums(columns: list[torch.Tensor], lengths: list[int]) -> list[list[float]]:
    """Per column (per-token values of the samples laid end to end, `lengths` tokens each), each sample's sum:
    float(values.sum()) of the sample's own tensor, bit for bit, in a few whole-batch operations.

    The samples of one length are summed as the rows of one [samples, length] tensor, which torch adds exactly as
    it adds each row alone (a running or scatter sum would differ from it in the last bits); a unit test holds torch
    to it (tests/unit/test_rl_step.py) for the CPU tensors the trainer makes these from."""
    sums = [[0.0] * len(lengths) for _ in columns]
    starts = list(accumulate(lengths, initial=0))
    by_length: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        if n:
            by_length.setdefault(n, []).append(i)
    same = len({c.dtype for c in columns}) == 1
    stacked = [torch.stack(columns)] if same and columns else [c[None] for c in columns]
    for n, samples in by_length.items():
        where = torch.tensor([starts[i] for i in samples])[:, None] + torch.arange(n)
        rows = [row for block in stacked for row in block[:, where].sum(-1).tolist()]
        for out, values in zip(sums, rows, strict=True):
            for i, value in zip(samples, values, strict=True):
                out[i] = value
    return sums
