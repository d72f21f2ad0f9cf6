"""The rewards shaped on the rollout side (buffer/group_rewards.py), before the DP split: DAPO's overlong penalty,
then each estimator's group baseline, checked against hand-computed values, with a group whose samples land on two
DP ranks; and a rank's share carrying its own rows' rewards and nothing per sample of the whole rollout."""

from __future__ import annotations

import math
import pickle
import threading
from argparse import Namespace
from typing import Any

import pytest
import torch

from buffer.group_rewards import RewardShaping, shape_rewards
from buffer.train_data import RankShare, RolloutSummary, TrainData, split_by_dp
from slime_like.trainer.algorithms.loss import policy_loss_fn
from slime_like.trainer.algorithms.rl_step import Forwards, OneRank, RLStep, every_sample, lacking
from slime_like.trainer.algorithms.step_hooks import StepHooks

# Groups of 4, 3 and 1 samples. --rollout-max-response-len 8, --overlong-buffer-len 4: responses over 4 tokens lose
# (n - 4) / 4, so the lengths below cost 0.5, 0, 0, 0 | 0.25, 0, 0 | 0.75 and the rewards become
# [1, 0, 1, 0 | 3, 0, 0 | -0.25].
RAW = [1.5, 0.0, 1.0, 0.0, 3.25, 0.0, 0.0, 0.5]
GROUPS = [0, 0, 0, 0, 1, 1, 1, 2]
LENGTHS = [6, 1, 4, 2, 5, 3, 2, 7]
PENALISED = [1.0, 0.0, 1.0, 0.0, 3.0, 0.0, 0.0, -0.25]
PROMPT = 3
EPS = 1e-6


def rollout(**overrides: Any) -> TrainData:
    data = TrainData(
        tokens=[list(range(PROMPT + n)) for n in LENGTHS],
        response_lengths=list(LENGTHS),
        loss_masks=[[1] * n for n in LENGTHS],
        raw_rewards=list(RAW),
        group_ids=list(GROUPS),
        rollout_log_probs=[[-1.0] * n for n in LENGTHS],
        sample_indices=list(range(len(RAW))),
        weight_versions=[0] * len(RAW),
    )
    for key, value in overrides.items():
        setattr(data, key, value)
    return data


def shaping(estimator: str, **kw: Any) -> RewardShaping:
    return RewardShaping(estimator, max_response_len=8, overlong_buffer_len=4, **kw)


# Group 0 [1, 0, 1, 0]: mean 1/2, unbiased std sqrt(1/3). Group 1 [3, 0, 0]: mean 1, deviations [2, -1, -1],
# unbiased std sqrt(3). Group 2 is one sample: no spread, no baseline.
G0 = 0.5 / (1 / math.sqrt(3) + EPS)
G1 = 1 / (math.sqrt(3) + EPS)
HAND = {
    "grpo": [G0, -G0, G0, -G0, 2 * G1, -G1, -G1, 0.0],
    "gspo": [G0, -G0, G0, -G0, 2 * G1, -G1, -G1, 0.0],
    "grpo-no-std": [0.5, -0.5, 0.5, -0.5, 2.0, -1.0, -1.0, 0.0],  # Dr.GRPO: r - mean
    # Leave-one-out: 1 - (0 + 1 + 0) / 3 = 2/3, 0 - (1 + 1 + 0) / 3 = -2/3; 3 - 0 = 3, 0 - (3 + 0) / 2 = -1.5.
    "rloo": [2 / 3, -2 / 3, 2 / 3, -2 / 3, 3.0, -1.5, -1.5, 0.0],
    "reinforce_plus_plus_baseline": [0.5, -0.5, 0.5, -0.5, 2.0, -1.0, -1.0, 0.0],  # r - group mean
    "reinforce_plus_plus": PENALISED,  # no group baseline
    "ppo": PENALISED,
}


@pytest.mark.parametrize("name", list(HAND))
def test_rollout_side_rewards_hand_computed(name: str) -> None:
    estimator, use_std = (name.removesuffix("-no-std"), not name.endswith("-no-std"))
    shaped = shape_rewards(rollout(), shaping(estimator, use_std=use_std))
    assert shaped.rewards == pytest.approx(PENALISED, abs=1e-12)
    assert shaped.baselined_rewards == pytest.approx(HAND[name], abs=1e-9)
    assert shaped.raw_rewards == RAW  # the scored rewards stay as they were


@pytest.mark.parametrize("estimator", ["grpo", "cispo", "reinforce_plus_plus_baseline", "rloo"])
def test_normalisation_off_or_done_by_a_slime_post_process(estimator: str) -> None:
    # --disable-rewards-normalization, or rewards a slime post-process normalised: grpo-like and the
    # reinforce_plus_plus_baseline take the (penalised) rewards as they are; rloo's baseline is its estimator.
    off = shape_rewards(rollout(), shaping(estimator, normalization=False))
    done = shape_rewards(rollout(reward_normalized=[True] * len(RAW)), shaping(estimator))
    want = HAND["rloo"] if estimator == "rloo" else PENALISED
    assert off.baselined_rewards == pytest.approx(want, abs=1e-12)
    assert done.baselined_rewards == pytest.approx(want, abs=1e-12)
    partly = shape_rewards(rollout(reward_normalized=[True] * 7 + [False]), shaping("grpo"))
    assert partly.baselined_rewards == pytest.approx(HAND["grpo"], abs=1e-9)  # only when every sample is


def test_a_group_split_over_two_ranks_gets_its_whole_groups_values() -> None:
    shares = split_by_dp(shape_rewards(rollout(), shaping("grpo")), 2, 8)
    # Token-balanced (lengths 9 4 7 5 8 6 5 10): rank 0 takes samples 1 2 5 7, rank 1 samples 0 3 4 6, so
    # groups 0 and 1 each have samples on both ranks.
    assert [s.rows for s in shares] == [[1, 2, 5, 7], [0, 3, 4, 6]]
    for share in shares:
        assert share.data.baselined_rewards == pytest.approx([HAND["grpo"][r] for r in share.rows], abs=1e-9)
        assert share.data.rewards == pytest.approx([PENALISED[r] for r in share.rows], abs=1e-12)
        # Of the whole rollout a share knows its size and whether a post-process normalised the rewards: no list.
        assert share.rollout == RolloutSummary(len(RAW), False, [])


def test_a_shares_knowledge_of_the_rollout_does_not_grow_with_it() -> None:
    def summary_bytes(copies: int) -> int:
        big = rollout()
        big = TrainData(**{k: v * copies for k, v in vars(big).items()})
        big.group_ids = [g + 3 * (i // len(RAW)) for i, g in enumerate(big.group_ids)]
        share = split_by_dp(shape_rewards(big, shaping("grpo")), 2, len(big))[0]
        return len(pickle.dumps(share.rollout))

    assert summary_bytes(100) - summary_bytes(1) <= 2  # 800 samples: the size's int grows by a byte or two


class Threads:
    """The DP collectives of ranks run as threads (rank `rank`'s view): exact sums in rollout order."""

    def __init__(self, size: int) -> None:
        self.barrier, self.slots = threading.Barrier(size), [None] * size

    def view(self, rank: int) -> Any:
        group = self

        class View:
            def objects(self, obj: Any) -> list[Any]:
                group.slots[rank] = obj
                group.barrier.wait()
                out = list(group.slots)
                group.barrier.wait()
                return out

            def rows(self, share: RankShare, values: list[float]) -> list[float]:
                parts = self.objects(OneRank().rows(share, values))
                return [sum(p[i] for p in parts) for i in range(len(share.rollout))]

        return View()


def test_two_ranks_train_on_the_rollout_sides_advantages_and_report_the_penalty_mean() -> None:
    args = Namespace(
        advantage_estimator="grpo", disable_grpo_std_normalization=False, normalize_advantages=False, use_opd=False,
        kl_coef=0.0, rollout_max_response_len=8, overlong_buffer_len=4, overlong_penalty_factor=1.0, use_tis=False,
        custom_tis_function_path=None, use_mis=False, use_decoupled_loss=False, use_rollout_logprobs=False,
        mis_low=0.5, mis_high=2.0, loss_agg_mode="token-mean", eps_clip=0.2, eps_clip_high=0.2, eps_clip_c=None,
        entropy_coef=0.0, use_kl_loss=False, use_opsm=False, use_unbiased_kl=False,
    )  # fmt: skip
    shares = split_by_dp(shape_rewards(rollout(), RewardShaping.from_args(args)), 2, 8)
    hooks, group, results = StepHooks(policy_loss_fn(args, (None, None))), Threads(2), [None, None]

    def run(rank: int) -> None:
        forwards = Forwards([torch.full((n,), -1.0) for n in shares[rank].data.response_lengths])
        results[rank] = RLStep(args, hooks, group.view(rank)).rl_batch(shares[rank], forwards)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for share, (batch, metrics) in zip(shares, results, strict=True):  # type: ignore[misc]
        for advantages, r in zip(batch.advantages, share.rows, strict=True):
            assert advantages.tolist() == pytest.approx([HAND["grpo"][r]] * LENGTHS[r], abs=1e-6)
        # The penalties 0.5 + 0.25 + 0.75 over 8 samples, as one process holding the rollout reported it.
        assert metrics["train/overlong_penalty_mean"] == pytest.approx(-1.5 / 8, abs=1e-12)


def test_a_missing_column_is_found_alike_on_every_rank() -> None:
    # Without rollout-wide flags: each rank marks its own samples that lack a column and one all-reduce counts them
    # (the error gathers their indices). Samples 2 (rank 0) and 4 (rank 1) have no teacher log-probs, and no sample
    # has routed experts.
    teacher = [None if i in (2, 4) else [-1.0] * n for i, n in enumerate(LENGTHS)]
    shares = split_by_dp(shape_rewards(rollout(teacher_log_probs=teacher), shaping("grpo")), 2, 8)
    group, found = Threads(2), [None, None]

    def run(rank: int) -> None:
        view = group.view(rank)
        errors = []
        for column in ("teacher_log_probs", "rollout_routed_experts", "rollout_log_probs"):
            try:
                every_sample(shares[rank], view, column, "--flag", "the hint")
                errors.append(None)
            except ValueError as exc:
                errors.append(str(exc))
        found[rank] = (lacking(shares[rank], view, "teacher_log_probs"), errors)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert found[0] == found[1]
    missing, errors = found[0]  # type: ignore[misc]
    assert missing == 2
    assert errors == [
        "--flag: 2 of 8 samples have no teacher_log_probs (sample indices [2, 4]): the hint",
        "--flag: 8 of 8 samples have no rollout_routed_experts (sample indices [0, 1, 2, 3, 4, 5, 6, 7]): the hint",
        None,
    ]
