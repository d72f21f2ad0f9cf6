"""slime's trainer hooks on a real trainer rank: init, before each log-prob forward and optimizer step, and the
rollout-data post-process whose loss masks train."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from tests.megatron.algo_common import actor_args, make_data

HOOKS = """
CALLS = []


def init(args):
    CALLS.append(("init",))


def before_log_prob(args, model, store_prefix):
    CALLS.append(("log_prob", store_prefix, len(model)))


def before_step(args, rollout_id, step_id, model, optimizer, opt_param_scheduler):
    CALLS.append(("step", rollout_id, step_id, opt_param_scheduler is not None))


def nothing_trains(args, rollout_id, rollout_data):
    CALLS.append(("postprocess", rollout_id, sorted(rollout_data)))
    rollout_data["loss_masks"] = [m * 0 for m in rollout_data["loss_masks"]]
"""


@pytest.fixture
def hooks(tmp_path: Path):
    (tmp_path / "trainer_hooks_under_test.py").write_text(HOOKS)
    sys.path.insert(0, str(tmp_path))
    yield __import__("trainer_hooks_under_test")
    sys.path.remove(str(tmp_path))
    sys.modules.pop("trainer_hooks_under_test", None)


def test_hooks_are_called_as_slime_calls_them(hooks, tiny_qwen3: Path, megatron_world: None, monkeypatch) -> None:
    from slime_like.trainer.actor import TrainActor

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, os.environ.get(key, "0"))
    m = "trainer_hooks_under_test"
    flags = [
        "--custom-megatron-init-path", f"{m}.init", "--custom-megatron-before-log-prob-hook-path",
        f"{m}.before_log_prob", "--custom-megatron-before-train-step-hook-path", f"{m}.before_step",
        "--rollout-data-postprocess-path", f"{m}.nothing_trains", "--use-kl-loss", "--kl-loss-coef", "0.1",
    ]  # fmt: skip
    actor = TrainActor(actor_args(tiny_qwen3, flags), 0, "127.0.0.1", 0)
    before = actor._snapshot()
    metrics = actor.train(3, make_data())
    assert hooks.CALLS[0] == ("init",)
    assert hooks.CALLS[1:3] == [("log_prob", "", 1), ("log_prob", "ref_", 1)]
    name, rollout_id, keys = hooks.CALLS[3]
    assert (name, rollout_id) == ("postprocess", 3)
    assert {"tokens", "loss_masks", "log_probs", "advantages", "ref_log_probs", "response_lengths"} <= set(keys)
    assert hooks.CALLS[4:] == [("step", 3, 0, True), ("step", 3, 1, True)]  # 8 samples, 4 a step
    # The post-process masked every token out: nothing to learn, the weights stay.
    assert metrics["train/grad_norm"] == 0.0
    assert all(torch.equal(v, before[k]) for k, v in actor._snapshot().items())


def test_a_hook_with_the_wrong_signature_is_named_at_start(hooks, tiny_qwen3: Path, capsys) -> None:
    with pytest.raises(SystemExit):
        actor_args(tiny_qwen3, ["--custom-megatron-before-train-step-hook-path", "trainer_hooks_under_test.init"])
    err = capsys.readouterr().err
    assert "--custom-megatron-before-train-step-hook-path='trainer_hooks_under_test.init'" in err
    assert "must accept 6 positional argument(s)" in err
