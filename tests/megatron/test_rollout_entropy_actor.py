"""slime's --use-rollout-entropy on a real trainer rank: the old-policy forward's entropies reach slime's rollout
data (a --rollout-data-postprocess-path hook) and rollout/entropy."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from tests.megatron.algo_common import actor_args, make_data

HOOK = """
SEEN = {}


def keep(args, rollout_id, rollout_data):
    SEEN.update(rollout_data)
"""


@pytest.fixture
def hook(tmp_path: Path):
    (tmp_path / "entropy_hook_under_test.py").write_text(HOOK)
    sys.path.insert(0, str(tmp_path))
    yield __import__("entropy_hook_under_test")
    sys.path.remove(str(tmp_path))
    sys.modules.pop("entropy_hook_under_test", None)


def test_entropies_of_the_old_policy_forward(hook, tiny_qwen3: Path, megatron_world: None, monkeypatch) -> None:
    from slime_like.trainer.actor import TrainActor

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, os.environ.get(key, "0"))
    flags = ["--use-rollout-entropy", "--rollout-data-postprocess-path", "entropy_hook_under_test.keep"]
    actor = TrainActor(actor_args(tiny_qwen3, flags), 0, "127.0.0.1", 0)
    data = make_data()
    _, expected = actor.engine.forward_logprobs(data.tokens, with_entropy=True)  # the weights the step starts from
    metrics = actor.train(0, data)
    got = hook.SEEN["entropy"]
    assert [len(e) for e in got] == data.response_lengths
    for e, full, n in zip(got, expected, data.response_lengths, strict=True):
        torch.testing.assert_close(e, full[-n:].float(), rtol=1e-5, atol=1e-5)
    mean = float(torch.cat(got).mean())
    assert 0.0 < mean and metrics["rollout/entropy"] == pytest.approx(mean, rel=1e-5)
