"""slime-style custom loss and advantage hooks (tests/integration/slime_plugins/algorithms.py) in a real train
step, and rewards a slime reward post-process normalised taken by the trainer as they are."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.megatron.algo_common import REWARDS, TOKENS, actor_args, make_data

PLUGINS = Path(__file__).resolve().parents[1] / "integration"


@pytest.fixture
def make_actor(tiny_qwen3: Path, megatron_world: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    from slime_like.trainer.actor import TrainActor

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, os.environ.get(key, "0"))  # TrainActor sets them; restored after the test
    monkeypatch.syspath_prepend(str(PLUGINS))  # slime_plugins, as a slime user's PYTHONPATH would
    yield lambda *flags: TrainActor(actor_args(tiny_qwen3, list(flags)), 0, "127.0.0.1", 0)
    for name in [m for m in sys.modules if m.startswith("slime_plugins")]:
        del sys.modules[name]


def test_slime_loss_and_advantage_match_the_native_hooks(make_actor) -> None:
    slime_flags = [
        "--custom-advantage-function-path", "slime_plugins.algorithms.reward_minus_half",
        "--loss-type", "custom_loss", "--custom-loss-function-path", "slime_plugins.algorithms.reinforce_loss",
    ]  # fmt: skip
    actor = make_actor(*slime_flags)
    assert actor.slime_loss and actor.slime_advantage
    m = actor.train(0, make_data())
    # The same advantages as tests/megatron/test_actor.py's native hook: their token mean over the 19 loss tokens.
    assert m["train/advantage_mean"] == pytest.approx(-0.5 / 19, abs=1e-6)
    assert m["train/logp"] < 0 and m["train/entropy"] > 0 and m["train/grad_norm"] > 0
    seen = sys.modules["slime_plugins.algorithms"].SEEN[-1]
    assert seen["raw_reward"] == REWARDS and seen["total_lengths"] == [len(t) for t in TOKENS]
    assert all(float(k.abs().sum()) == 0.0 for k in seen["kl"])  # no --kl-coef: slime hands zeros
    # slime's rollout_data["rewards"] are group-normalised (groups 0, 1, 3 have rewards 1/0; group 2 0.5/0.5).
    assert seen["rewards"][0] > 0 > seen["rewards"][1] and seen["rewards"][4] == seen["rewards"][5] == 0.0
    # sum_of_sample_mean is our aggregation: the same REINFORCE loss written natively takes the same step.
    native = make_actor(
        "--custom-advantage-function-path", "tests.megatron.test_actor.my_advantages",
        "--loss-type", "custom_loss", "--custom-loss-function-path", "tests.megatron.test_actor.my_loss",
    ).train(0, make_data())  # fmt: skip
    assert m["train/loss"] == pytest.approx(native["train/loss"], rel=1e-5)
    assert m["train/grad_norm"] == pytest.approx(native["train/grad_norm"], rel=1e-4)


def test_rewards_normalised_by_a_slime_post_process_are_the_advantages(make_actor) -> None:
    data = make_data()
    data.raw_rewards = [0.3, -0.3, 0.1, -0.1, 0.0, 0.0, -0.2, 0.2]
    data.reward_normalized = [True] * len(data)
    m = make_actor().train(0, data)  # grpo: without the flag these would be normalised to about +-1 again
    lengths, masks = data.response_lengths, data.loss_masks
    expected = sum(r * sum(mask) for r, mask in zip(data.raw_rewards, masks, strict=True)) / sum(map(sum, masks))
    assert len(lengths) == 8 and m["train/advantage_mean"] == pytest.approx(expected, abs=1e-6)
    assert math.isfinite(m["train/grad_norm"])
