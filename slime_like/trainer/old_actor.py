"""slime's --keep-old-actor: the trainer keeps the weights that generated the rollout, for the old policy's log-probs.

slime (slime/backends/megatron_utils/actor.py) keeps two extra copies of the policy's weights on each trainer rank,
tagged `old_actor` and (with --update-weights-interval 1) `rollout_actor`; both start as the loaded weights. The old
policy's log-prob forward of every rollout runs with `old_actor` swapped in (the training forwards with the current
weights), and each weight update rotates them:

- --update-weights-interval 1: old_actor <- rollout_actor, then rollout_actor <- the weights just sent. So the
  rollout trained after update k is scored with the weights of update k-1: the ones that generated it in the
  one-step-ahead loop (`slime_like.train_async`), where rollout r+1 is generated before rollout r's update lands.
- an interval N > 1: old_actor <- the weights just sent (the engines' weights until the next update).

In the synchronous loop (`slime_like.train`) every rollout is generated after the previous update, so slime's queue
scores it with the weights one update older than the generating ones: that is slime's behaviour, kept, and warned
about at start. The copies live with the model's own tensors (same device, same dtype); a swap copies in place.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

logger = logging.getLogger(__name__)

Weights = dict[str, torch.Tensor]


class OldActor:
    """The `old_actor` (and `rollout_actor`) copies of one rank's policy weights, rotated as slime rotates them."""

    def __init__(self, live: Callable[[], Weights], update_weights_interval: int) -> None:
        """`live`: the model's own tensors by name (not copies: a swap writes into them)."""
        self.live = live
        self.old: Weights = _clone(live())
        # slime keeps rollout_actor only with --update-weights-interval 1 (else old_actor follows each update).
        self.rollout: Weights | None = _clone(live()) if update_weights_interval == 1 else None

    def reset(self) -> None:
        """After a checkpoint load: both copies become the loaded weights (slime loads old_actor from --load)."""
        _copy(self.old, self.live())
        if self.rollout is not None:
            _copy(self.rollout, self.live())

    def rotate(self) -> None:
        """After a weight update, as slime: old_actor <- rollout_actor <- the sent weights (interval 1), or
        old_actor <- the sent weights."""
        if self.rollout is not None:
            _copy(self.old, self.rollout)
            _copy(self.rollout, self.live())
        else:
            _copy(self.old, self.live())

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Within: the model holds old_actor's weights; after (also on error): its own again."""
        current = _clone(self.live())
        _copy(self.live(), self.old)
        try:
            yield
        finally:
            _copy(self.live(), current)


def _clone(weights: Weights) -> Weights:
    return {k: v.detach().clone() for k, v in weights.items()}


def _copy(dst: Weights, src: Weights) -> None:
    with torch.no_grad():
        for k, v in dst.items():
            v.copy_(src[k])
