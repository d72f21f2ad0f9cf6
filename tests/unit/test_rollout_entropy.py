"""slime's --use-rollout-entropy: the old-policy forward's entropies in the batch, slime's rollout data and
rollout/entropy; the forward each flag combination asks the engine for."""

from __future__ import annotations

from argparse import Namespace
from typing import Any

import pytest
import torch

from slime_like.arguments import parse_args
from slime_like.trainer.algorithms.loss import policy_loss_fn
from slime_like.trainer.algorithms.rl_step import Forwards, OneRank, RLStep
from slime_like.trainer.algorithms.slime_lists import slime_lists
from slime_like.trainer.algorithms.step_hooks import StepHooks
from slime_like.trainer.hooks import TrainerHooks
from slime_like.trainer.rollout_entropy import entropy_metrics, old_policy_forward
from tests.unit.test_rl_step import _args, _share


class Engine:
    """The engine calls old_policy_forward makes, answered with fixed per-token values."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def forward_logprobs(self, tokens: list[list[int]], **kw: Any) -> Any:
        self.calls.append(("forward_logprobs", kw))
        lp = [torch.full((len(t) - 1,), -1.0) for t in tokens]
        return (lp, [torch.full((len(t) - 1,), 2.0) for t in tokens]) if kw.get("with_entropy") else lp

    def forward_logprobs_and_routing(self, tokens: list[list[int]], **kw: Any) -> Any:
        self.calls.append(("forward_logprobs_and_routing", kw))
        return [torch.full((len(t) - 1,), -1.0) for t in tokens], ["recorded"]


def test_old_policy_forward_asks_for_entropies_with_the_flag() -> None:
    engine, tokens = Engine(), [[1, 2, 3]]
    lp, entropy, routing = old_policy_forward(engine, Namespace(use_rollout_entropy=True), tokens, None)
    assert entropy is not None and entropy[0].tolist() == [2.0, 2.0] and routing is None
    assert engine.calls[-1] == (
        "forward_logprobs",
        {"with_entropy": True, "routing": None, "local": True, "multimodal": None},
    )
    lp, entropy, routing = old_policy_forward(engine, Namespace(), tokens, ["r3"])
    assert (
        entropy is None
        and routing == ["r3"]
        and engine.calls[-1][1] == {"routing": ["r3"], "local": True, "multimodal": None}
    )
    _, entropy, routing = old_policy_forward(engine, Namespace(use_routing_replay=True), tokens, None)
    assert routing == ["recorded"] and entropy is None and engine.calls[-1][0] == "forward_logprobs_and_routing"


def test_entropy_metric_is_the_mean_over_every_response_token() -> None:
    entropy = [torch.tensor([1.0, 2.0, 3.0]), torch.tensor([6.0])]
    assert entropy_metrics(entropy, lambda values: values) == {"rollout/entropy": 3.0}  # 12 / 4, no mask
    assert entropy_metrics([], lambda values: values) == {"rollout/entropy": 0.0}


def test_the_batch_and_slimes_rollout_data_carry_them() -> None:
    args = _args()
    step = RLStep(args, StepHooks(policy_loss_fn(args, (None, None))), OneRank())
    entropy = [torch.tensor([0.5, 1.0, 1.5]), torch.zeros(3), torch.tensor([4.0, 4.0]), torch.tensor([1.0, 1.0])]
    lengths = (3, 3, 2, 2)
    batch, metrics = step.rl_batch(_share(), Forwards([torch.full((n,), -1.0) for n in lengths], entropy=entropy))
    assert metrics["rollout/entropy"] == pytest.approx(13.0 / 10)  # (3 + 0 + 8 + 2) / 10 tokens, masked ones too
    assert [e.tolist() for e in batch.entropy] == [e.tolist() for e in entropy]
    seen: dict[str, Any] = {}

    def postprocess(_args: Any, _rollout_id: int, rollout_data: dict[str, Any]) -> None:
        seen.update(rollout_data)
        rollout_data["loss_masks"] = [(e < 3.0).float() for e in rollout_data["entropy"]]  # slime's "special mask"

    masked = TrainerHooks(rollout_data_postprocess=postprocess).postprocess(args, 0, batch)
    assert [e.tolist() for e in seen["entropy"]] == [e.tolist() for e in entropy]
    assert masked.loss_masks == [[1, 1, 1], [1, 1, 1], [0, 0], [1, 1]]
    plain, metrics = step.rl_batch(_share(), Forwards([torch.full((n,), -1.0) for n in lengths]))
    assert plain.entropy == [] and "rollout/entropy" not in metrics and "entropy" not in slime_lists(plain)


def test_the_flag(base: list[str]) -> None:
    assert parse_args(base + ["--use-rollout-entropy"]).use_rollout_entropy is True
    assert parse_args(base).use_rollout_entropy is False
    from slime_like.core.errors import ArgumentError
    from slime_like.trainer.train_options import validate_train_options

    args = parse_args(base + ["--use-rollout-entropy"])
    args.use_routing_replay = True  # recording the routing (an MoE checkpoint's flag): no entropies from it yet
    with pytest.raises(ArgumentError, match="--use-rollout-entropy with --use-routing-replay"):
        validate_train_options(args)
    args.use_rollout_routing_replay = True  # R3 replays in the plain forward, which gives them
    validate_train_options(args)
