"""The rollout's split over data-parallel ranks, and advantages computed on the shares: equal, bit for bit, to
those of one process holding the whole rollout (and to hand-computed values)."""

from __future__ import annotations

import argparse
import math
import threading

import pytest
import torch

from buffer.group_rewards import RewardShaping, shape_rewards
from buffer.train_data import RankShare, RolloutSummary, TrainData, balanced_split, split_by_dp
from slime_like.trainer.algorithms.advantages import AdvantageInputs, RolloutScope, compute_advantages
from slime_like.trainer.algorithms.aggregation import token_weights

# Three prompts: groups of 4, 3 and 1 samples; response lengths chosen so that the balanced split puts samples
# of one group on different ranks.
REWARDS = [1.0, 0.0, 1.0, 0.0, 3.0, 0.0, 0.0, 0.5]
GROUPS = [0, 0, 0, 0, 1, 1, 1, 2]
RESPONSES = [6, 1, 4, 2, 5, 3, 2, 7]
PROMPT = 3


def rollout() -> TrainData:
    """The fixed rollout; sample 3's last token is a tool's (loss mask 0)."""
    masks = [[1] * n for n in RESPONSES]
    masks[3][-1] = 0
    return TrainData(
        tokens=[list(range(PROMPT + n)) for n in RESPONSES],
        response_lengths=list(RESPONSES),
        loss_masks=masks,
        raw_rewards=list(REWARDS),
        group_ids=list(GROUPS),
        rollout_log_probs=[[-1.0] * n for n in RESPONSES],
        sample_indices=list(range(len(REWARDS))),
        weight_versions=[0] * len(REWARDS),
    )


def args(estimator: str, normalize: bool = False) -> argparse.Namespace:
    return argparse.Namespace(
        advantage_estimator=estimator,
        disable_grpo_std_normalization=False,
        rewards_normalization=True,
        normalize_advantages=normalize,
        kl_coef=0.0,
        gamma=1.0,
        use_opd=False,
    )


def inputs_of(data: TrainData) -> AdvantageInputs:
    """The advantage inputs of `data`; a share's carry its rows' rewards baselined on the rollout side."""
    masks = [torch.tensor(m, dtype=torch.float32) for m in data.loss_masks]
    log_probs = [torch.full((n,), -1.0) for n in data.response_lengths]
    inputs = AdvantageInputs(list(data.raw_rewards), list(data.group_ids), masks, log_probs)
    inputs.baselined = list(data.baselined_rewards) if len(data.baselined_rewards) == len(data) else None
    return inputs


def shaped_split(ns: argparse.Namespace, data: TrainData, dp: int, per_step: int) -> list[RankShare]:
    """The rollout side's shares: rewards shaped (group baselines) over the whole rollout, then split."""
    return split_by_dp(shape_rewards(data, RewardShaping.from_args(ns)), dp, per_step)


class ThreadAllReduce:
    """What the trainer's all-reduce does for `dp` ranks run as threads: each fills its own rows, all get the sum."""

    def __init__(self, dp: int, size: int) -> None:
        self.barrier = threading.Barrier(dp)
        self.lock = threading.Lock()
        self.size = size
        self.total = torch.zeros(size, dtype=torch.float64)

    def __call__(self, share: RankShare, values: list[float]) -> list[float]:
        if self.barrier.wait() == 0:
            self.total = torch.zeros(self.size, dtype=torch.float64)
        self.barrier.wait()
        with self.lock:
            if share.rows:
                self.total[share.rows] += torch.tensor(values, dtype=torch.float64)
        self.barrier.wait()
        return self.total.tolist()


def on_shares(ns: argparse.Namespace, shares: list[RankShare]) -> list[torch.Tensor]:
    """Every rank's advantages (ranks run as threads), put back in rollout order."""
    gather = ThreadAllReduce(len(shares), len(shares[0].rollout))
    out: dict[int, torch.Tensor] = {}
    errors: list[BaseException] = []

    def rank(share: RankShare) -> None:
        try:
            scope = RolloutScope(lambda v: gather(share, v))
            result = compute_advantages(ns, inputs_of(share.data), None, scope)
            out.update(zip(share.rows, result.advantages, strict=True))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)
            gather.barrier.abort()

    threads = [threading.Thread(target=rank, args=(s,)) for s in shares]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [out[i] for i in range(len(out))]


def test_balanced_split_is_token_balanced_and_deterministic() -> None:
    lengths = [9, 1, 4, 4, 7, 2, 2]
    parts = balanced_split(lengths, 3)
    assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
    loads = [sum(lengths[i] for i in p) for p in parts]
    assert max(loads) - min(loads) <= max(lengths)
    assert parts == balanced_split(lengths, 3) and all(p == sorted(p) for p in parts)
    assert balanced_split([4], 2) == [[0], []]


@pytest.mark.parametrize(("dp", "per_step"), [(1, 8), (2, 8), (2, 4), (3, 4), (4, 2)])
def test_shares_partition_every_step(dp: int, per_step: int) -> None:
    data = rollout()
    shares = split_by_dp(data, dp, per_step)
    assert [s.dp_rank for s in shares] == list(range(dp)) and all(s.dp_size == dp for s in shares)
    assert sorted(r for s in shares for r in s.rows) == list(range(len(data)))
    for share in shares:
        assert share.rows == sorted(share.rows)
        assert share.data.tokens == [data.tokens[r] for r in share.rows]
        # Its own rows' rewards and groups; of the whole rollout only its size.
        assert share.data.raw_rewards == [REWARDS[r] for r in share.rows]
        assert share.data.group_ids == [GROUPS[r] for r in share.rows]
        assert share.rollout == RolloutSummary(len(data))
        assert share.step_bounds == [(b, min(b + per_step, len(data))) for b in range(0, len(data), per_step)]
    for step, (begin, end) in enumerate(shares[0].step_bounds):
        # Each step is split over the ranks as balanced_split splits that step's sequences.
        expected = balanced_split([len(t) for t in data.tokens[begin:end]], dp)
        got = [[s.rows[i] - begin for i in s.steps[step]] for s in shares]
        assert got == expected


def test_length_multiple_rounds_before_balancing() -> None:
    data = TrainData(tokens=[[0] * 5, [0] * 3, [0] * 3], response_lengths=[1, 1, 1], loss_masks=[[1]] * 3)
    # Lengths 5, 3, 3 split [0] | [1, 2]; rounded to 8, 8, 8 the third sequence goes to the rank with fewer.
    assert [s.rows for s in split_by_dp(data, 2, 3)] == [[0], [1, 2]]
    assert [s.rows for s in split_by_dp(data, 2, 3, multiple=8)] == [[0, 2], [1]]


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_plus_plus_baseline"])
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize(("dp", "per_step"), [(2, 8), (3, 4), (4, 2)])
def test_advantages_on_shares_equal_the_whole_rollouts(estimator: str, normalize: bool, dp: int, per_step: int) -> None:
    data, ns = rollout(), args(estimator, normalize)
    shares = shaped_split(ns, data, dp, per_step)
    assert any(sum(g in s.data.group_ids for s in shares) > 1 for g in GROUPS), "no group spans ranks: no test"
    whole = compute_advantages(ns, inputs_of(data)).advantages
    for got, want in zip(on_shares(ns, shares), whole, strict=True):
        assert torch.equal(got, want)


def test_grpo_on_shares_hand_computed() -> None:
    shares = shaped_split(args("grpo"), rollout(), 3, 4)
    got = [float(a[0]) for a in on_shares(args("grpo"), shares)]
    # Group 0 [1, 0, 1, 0]: mean 0.5, unbiased std 1/sqrt(3). Group 1 [3, 0, 0]: mean 1, deviations [2, -1, -1],
    # unbiased std sqrt(3). Group 2 has one sample: 0.
    s0, s1, eps = 1 / math.sqrt(3), math.sqrt(3), 1e-6
    a0, a1 = 0.5 / (s0 + eps), 1 / (s1 + eps)
    assert got == pytest.approx([a0, -a0, a0, -a0, 2 * a1, -a1, -a1, 0.0], abs=1e-6)


def test_step_totals_give_the_whole_steps_weights() -> None:
    data = rollout()
    masks = [torch.tensor(m, dtype=torch.float32) for m in data.loss_masks]
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        whole = token_weights(masks, mode, 8)
        counts = [float(m.sum()) for m in masks]
        totals = (sum(c > 0 for c in counts), sum(counts))
        for share in split_by_dp(data, 3, 8):
            part = token_weights([masks[r] for r in share.rows], mode, 8, totals)
            for r, w in zip(share.rows, part, strict=True):
                assert torch.equal(w, whole[r])
