"""slime's --use-rollout-entropy: the old policy's log-prob forward also gives each response token's entropy.

The entropies go with the rank's batch (TrainData.entropy; slime's `rollout_data["entropy"]`, which a
--rollout-data-postprocess-path hook or a custom loss reads, e.g. to mask tokens), and `rollout/entropy` logs their
mean over every response token of the rollout, as slime logs it (loss mask or not).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


def old_policy_forward(
    engine: Any,
    args: Any,
    tokens: Sequence[Sequence[int]],
    routing: list[Any] | None,
    multimodal: Sequence[dict[str, Any] | None] | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor] | None, list[Any] | None]:
    """(log-probs, entropies or None, routing) of the old-policy forward of this rank's sequences: it records the
    routing with --use-routing-replay (R3 replays `routing`), and gives entropies with --use-rollout-entropy;
    `multimodal`: each sequence's images (a vision-language model's)."""
    if getattr(args, "use_routing_replay", False) and routing is None:
        logprobs, routing = engine.forward_logprobs_and_routing(tokens, local=True, multimodal=multimodal)
        return logprobs, None, routing  # the recording forward gives no entropies (refused at start)
    if getattr(args, "use_rollout_entropy", False):
        logprobs, entropy = engine.forward_logprobs(
            tokens, with_entropy=True, routing=routing, local=True, multimodal=multimodal
        )
        return logprobs, entropy, routing
    return engine.forward_logprobs(tokens, routing=routing, local=True, multimodal=multimodal), None, routing


def entropy_metrics(entropy: list[torch.Tensor], rows: Callable[[list[float]], list[float]]) -> dict[str, float]:
    """rollout/entropy: the mean over every response token of the rollout; `rows` gathers one value per sample of
    this rank into the whole rollout's (RLStep's collectives)."""
    tokens = sum(rows([float(e.numel()) for e in entropy]))
    total = sum(rows([float(e.sum()) for e in entropy]))
    return {"rollout/entropy": total / max(1.0, tokens)}
