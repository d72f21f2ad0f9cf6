"""The RL step's arithmetic (slime_like/trainer/algorithms/rl_step.py) without Ray or Megatron: a hand-built rollout of
two groups, the old policy's log-probs given, advantages, the batch's columns, step weights, loss and metrics checked
by hand."""

from __future__ import annotations

import math
import threading
from argparse import Namespace
from typing import Any

import pytest
import torch

from buffer.group_rewards import RewardShaping, shape_rewards
from buffer.train_data import RankShare, RolloutSummary, TrainData, split_by_dp
from slime_like.trainer.algorithms.advantages import AdvantageInputs
from slime_like.trainer.algorithms.loss import policy_loss_fn
from slime_like.trainer.algorithms.off_policy import mismatch_sums
from slime_like.trainer.algorithms.rl_step import Forwards, OneRank, RLStep, per_sample_sums
from slime_like.trainer.algorithms.slime_contract import slime_advantage_hook, slime_batch
from slime_like.trainer.algorithms.slime_lists import apply_slime_lists, slime_lists
from slime_like.trainer.algorithms.step_hooks import StepHooks


def _args(**kw: Any) -> Namespace:
    base = dict(
        advantage_estimator="grpo", disable_grpo_std_normalization=True, normalize_advantages=False, use_opd=False,
        kl_coef=0.0, overlong_buffer_len=0, use_tis=False, custom_tis_function_path=None, use_mis=False,
        use_decoupled_loss=False, use_rollout_logprobs=False, mis_low=0.5, mis_high=2.0, tis_clip_low=0.0,
        tis_clip=2.0, loss_agg_mode="token-mean", rollout_max_response_len=4, eps_clip=0.2, eps_clip_high=0.2,
        eps_clip_c=None, entropy_coef=0.0, use_kl_loss=False, use_opsm=False, use_unbiased_kl=False,
    )  # fmt: skip
    return Namespace(**{**base, **kw})


def _share() -> RankShare:
    # Group 0: rewards 1 and 0 (Dr.GRPO advantages +0.5, -0.5); group 1: 0.5 and 0.5 (advantage 0).
    # Loss tokens: 3, 1, 2, 2 (8 in all). SGLang's log-probs are -1 on every response token.
    data = TrainData(
        tokens=[[1, 2, 3, 4, 5], [1, 2, 6, 7, 8], [9, 9, 3, 3], [9, 9, 4, 4]],
        response_lengths=[3, 3, 2, 2],
        loss_masks=[[1, 1, 1], [1, 0, 0], [1, 1], [1, 1]],
        raw_rewards=[1.0, 0.0, 0.5, 0.5],
        group_ids=[0, 0, 1, 1],
        rollout_log_probs=[[-1.0] * 3, [-1.0] * 3, [-1.0] * 2, [-1.0] * 2],
        sample_indices=[0, 1, 2, 3],
        weight_versions=[0, 0, 0, 0],
    )
    # As the rollout side hands it over: rewards shaped (Dr.GRPO's group baselines) before the split.
    return split_by_dp(shape_rewards(data, RewardShaping.from_args(_args())), dp_size=1, global_batch_size=4)[0]


def _forwards(old: float = -1.0) -> Forwards:
    return Forwards([torch.full((n,), old) for n in (3, 3, 2, 2)])


def test_batch_step_weights_loss_and_metrics_of_a_hand_built_rollout() -> None:
    args = _args()
    step = RLStep(args, StepHooks(policy_loss_fn(args, (None, None))), OneRank())
    share = _share()
    batch, metrics = step.rl_batch(share, _forwards())
    assert [a.tolist() for a in batch.advantages] == [[0.5] * 3, [-0.5, 0.0, 0.0], [0.0] * 2, [0.0] * 2]
    assert batch.is_weights == [] and batch.ref_log_probs == []  # no correction, no KL term
    assert batch.tokens is share.data.tokens and share.data.advantages == []  # the share's columns, not copies
    # Advantage token mean (1.5 - 0.5) / 8; variance over the 8 loss tokens around it.
    mean = 1.0 / 8
    var = (3 * (0.5 - mean) ** 2 + (-0.5 - mean) ** 2 + 4 * mean**2) / 8
    assert metrics["train/advantage_mean"] == pytest.approx(mean)
    assert metrics["train/advantage_std"] == pytest.approx(math.sqrt(var))
    assert metrics["train/train_rollout_logprob_abs_diff"] == 0.0  # the old policy is SGLang's here
    counts = step.loss_tokens(share, batch)
    assert counts == [3.0, 1.0, 2.0, 2.0]
    weighted = step.step_batch(batch, counts, share.step_bounds[0])
    assert [w.tolist() for w in weighted.token_weights][:2] == [[1 / 8] * 3, [1 / 8, 0.0, 0.0]]
    # Ratio 1: the PPO loss is -A per token; the token mean over the step is -(3 * 0.5 - 0.5) / 8.
    log_probs = [torch.full((len(t),), -1.0) for t in share.data.tokens]
    loss, stats = step.hooks.loss_fn(log_probs, weighted, [torch.zeros(len(t)) for t in share.data.tokens])
    assert loss.item() == pytest.approx(-1.0 / 8) and stats["pg_clipfrac"] == 0.0
    assert RLStep.step_means([{"a": 1.0, "skipped_steps": 1.0}, {"a": 3.0, "skipped_steps": 1.0}]) == {
        "a": 2.0,
        "skipped_steps": 2.0,
    }


def test_tis_weights() -> None:
    # Old policy -0.5 against SGLang's -1: rho = e^0.5, clipped at 1.5 by --tis-clip.
    args = _args(use_tis=True, tis_clip=1.5)
    batch, metrics = RLStep(args, StepHooks(policy_loss_fn(args, (None, None))), OneRank()).rl_batch(
        _share(), _forwards(-0.5)
    )
    assert batch.is_weights[0].tolist() == [1.5] * 3
    assert metrics["train/is_weight_mean"] == pytest.approx(1.5)


def test_a_custom_advantage_function_sees_the_tokens_in_both_contracts() -> None:
    seen: dict[str, Any] = {}

    def ours(args: Any, inputs: AdvantageInputs) -> list[torch.Tensor]:
        seen["ours"] = inputs.tokens
        return [torch.full_like(m, r) * m for r, m in zip(inputs.rewards, inputs.loss_masks, strict=True)]

    def slimes(args: Any, rollout_data: dict[str, Any]) -> None:  # slime's: sets rollout_data["advantages"]
        seen["slime"] = [t.tolist() for t in rollout_data["tokens"]]
        rollout_data["advantages"] = [torch.full_like(m, 2.0) for m in rollout_data["loss_masks"]]

    args = _args(rewards_normalization=True)
    share = _share()
    batch, _ = RLStep(args, StepHooks(policy_loss_fn(args, (None, None)), ours), OneRank()).rl_batch(share, _forwards())
    assert batch.advantages[0].tolist() == [1.0] * 3 and seen["ours"] == share.data.tokens
    hooks = StepHooks(policy_loss_fn(args, (None, None)), slime_advantage_hook(slimes))
    batch, _ = RLStep(args, hooks, OneRank()).rl_batch(share, _forwards())
    assert batch.advantages[3].tolist() == [2.0, 2.0] and seen["slime"] == share.data.tokens


def test_one_mapping_to_slimes_keys_for_a_loss_batch_and_rollout_data() -> None:
    args = _args(use_tis=True)
    batch, _ = RLStep(args, StepHooks(policy_loss_fn(args, (None, None))), OneRank()).rl_batch(_share(), _forwards())
    loss_batch = slime_batch(batch)
    assert loss_batch["total_lengths"] == [5, 5, 4, 4] and loss_batch["response_lengths"] == [3, 3, 2, 2]
    assert loss_batch["returns"] is loss_batch["advantages"] and loss_batch["unconcat_tokens"] is loss_batch["tokens"]
    assert [float(s) for s in loss_batch["rollout_mask_sums"]] == [3.0, 1.0, 2.0, 2.0]
    assert "ref_log_probs" not in loss_batch and loss_batch["rollout_log_probs"][0].tolist() == [-1.0] * 3
    assert loss_batch["tokens"][1].tolist() == [1, 2, 6, 7, 8]
    data = slime_lists(batch)
    assert set(data) == {"tokens", "total_lengths", "response_lengths", "loss_masks", "log_probs", "advantages",
                         "rollout_log_probs"}  # fmt: skip
    data["advantages"] = [[1.0, 2.0, 3.0], [0.0] * 3, [0.0] * 2, [0.0] * 2]
    data["loss_masks"][1] = torch.tensor([0.0, 1.0, 1.0])
    changed = apply_slime_lists(data, batch, "--flag")
    assert changed.advantages[0].tolist() == [1.0, 2.0, 3.0] and changed.loss_masks[1] == [0.0, 1.0, 1.0]
    assert batch.advantages[0].tolist() == [0.5] * 3  # the batch it was given is left as it was
    data["loss_masks"] = [[1.0]] * 4
    with pytest.raises(ValueError, match=r"--flag: rollout_data\['loss_masks'\] entries must have one value"):
        apply_slime_lists(data, batch, "--flag")


class ThreadRanks:
    """The collectives of `size` data-parallel ranks run as threads of this process (rank `rank`'s view)."""

    def __init__(self, size: int) -> None:
        self.size, self.barrier, self.slots = size, threading.Barrier(size), [None] * size

    def rank(self, rank: int) -> Any:
        group = self

        class View:
            def objects(self, obj: Any) -> list[Any]:
                group.slots[rank] = obj
                group.barrier.wait()
                out = list(group.slots)
                group.barrier.wait()  # nobody writes the next call's slot before everyone has read this one
                return out

            def rows(self, share: RankShare, values: list[float]) -> list[float]:
                parts = self.objects(OneRank().rows(share, values))
                return [sum(p[i] for p in parts) for i in range(len(share.rollout))]

        return View()


@pytest.mark.parametrize("custom", [False, True])
def test_two_ranks_compute_what_one_does(custom: bool) -> None:
    # Whitened advantages sum over the whole rollout; a custom advantage function sees every rank's samples.
    def centred(args: Any, inputs: AdvantageInputs) -> list[torch.Tensor]:
        mean = sum(inputs.rewards) / len(inputs.rewards)  # the whole rollout's mean: wrong on a rank's share alone
        return [torch.full_like(m, r - mean) * m for r, m in zip(inputs.rewards, inputs.loss_masks, strict=True)]

    args = _args(normalize_advantages=True)
    hooks = StepHooks(policy_loss_fn(args, (None, None)), centred if custom else None)
    whole = _share()
    batch, metrics = RLStep(args, hooks, OneRank()).rl_batch(whole, _forwards())
    shares = split_by_dp(whole.data, dp_size=2, global_batch_size=4)
    group, results = ThreadRanks(2), [None, None]

    def run(rank: int) -> None:
        forwards = Forwards([torch.full((n,), -1.0) for n in shares[rank].data.response_lengths])
        results[rank] = RLStep(args, hooks, group.rank(rank)).rl_batch(shares[rank], forwards)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(shares[0].rows + shares[1].rows) == [0, 1, 2, 3]
    for share, (part, part_metrics) in zip(shares, results, strict=True):
        assert part_metrics == pytest.approx(metrics)
        for advantages, i in zip(part.advantages, share.rows, strict=True):
            assert torch.allclose(advantages, batch.advantages[i])


def _metrics_sample_by_sample(args: Any, advantages, masks, old_lp, rollout_lp, is_weights) -> dict[str, float]:
    """The rollout metrics as RLStep computed them before, one sample at a time (one rank)."""
    counts = [float(m.sum()) for m in masks]
    tokens = max(1.0, sum(counts))
    mean = sum(float((a * m).sum()) for a, m in zip(advantages, masks, strict=True)) / tokens
    var = sum(float((((a - mean) ** 2) * m).sum()) for a, m in zip(advantages, masks, strict=True)) / tokens
    metrics = {"train/advantage_mean": mean, "train/advantage_std": var**0.5}
    parts = [
        {} if r is None else mismatch_sums(o, r, m, args.mis_low, args.mis_high)
        for o, r, m in zip(old_lp, rollout_lp, masks, strict=True)
    ]
    n = max(1.0, sum(c for c, r in zip(counts, rollout_lp, strict=True) if r is not None))
    for key, name in (("abs_diff", "logprob_abs_diff"), ("kl", "kl"), ("out_of_band", "out_of_band_frac")):
        metrics[f"train/train_rollout_{name}"] = sum(p.get(key, 0.0) for p in parts) / n
    metrics["train/is_weight_mean"] = sum(float((w * m).sum()) for w, m in zip(is_weights, masks, strict=True)) / tokens
    metrics["train/is_dropped_frac"] = (
        sum(float(((w == 0).float() * m).sum()) for w, m in zip(is_weights, masks, strict=True)) / tokens
    )
    return metrics


def test_rollout_metrics_add_exactly_as_sample_by_sample() -> None:
    # Whole-share sums (per_sample_sums) must give the per-sample loop's floats bit for bit, at any lengths.
    gen = torch.Generator().manual_seed(0)
    lengths = [int(n) for n in torch.randint(0, 70, (96,), generator=gen)] + [8] * 32 + [1, 33, 200]
    masks = [(torch.rand(n, generator=gen) < 0.8).float() for n in lengths]
    advantages = [torch.randn(n, generator=gen) * m for n, m in zip(lengths, masks, strict=True)]
    old_lp = [-torch.rand(n, generator=gen) * 5 for n in lengths]
    rollout_lp = [None if i % 7 == 3 else o + torch.randn(len(o), generator=gen) * 0.3 for i, o in enumerate(old_lp)]
    is_weights = [torch.clamp(torch.randn(n, generator=gen) + 1, min=0) for n in lengths]
    args = _args()
    share = RankShare(
        TrainData(tokens=[[0]] * len(lengths), loss_masks=[m.tolist() for m in masks]),
        list(range(len(lengths))),
        [],
        [],
        RolloutSummary(len(lengths)),
    )
    got = RLStep(args, StepHooks(policy_loss_fn(args, (None, None))), OneRank())._rollout_metrics(
        share, advantages, masks, old_lp, rollout_lp, is_weights, True
    )
    assert got == _metrics_sample_by_sample(args, advantages, masks, old_lp, rollout_lp, is_weights)


def test_per_sample_sums_are_each_samples_own_sum() -> None:
    gen = torch.Generator().manual_seed(1)
    lengths = [5, 0, 17, 5, 64, 3, 17]
    parts = [torch.randn(n, generator=gen) * 10 for n in lengths]
    doubles = [p.double() for p in parts]
    sums = per_sample_sums([torch.cat(parts), torch.cat(doubles)], lengths)
    assert sums == [[float(p.sum()) for p in parts], [float(p.sum()) for p in doubles]]
    with pytest.raises(ValueError, match="advantages"):
        RLStep(_args(), StepHooks(policy_loss_fn(_args(), (None, None))), OneRank())._rollout_metrics(
            _share(), [torch.zeros(2)] * 4, _share().data.masks(), [torch.zeros(1)] * 4, [None] * 4, None, False
        )
