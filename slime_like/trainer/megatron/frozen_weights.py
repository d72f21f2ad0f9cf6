"""Frozen parameters a weight update may leave out: those still holding --hf-checkpoint's values (issue 34).

Every engine loads --hf-checkpoint when it starts (a restarted one too: rollout/catch_up.py), so a frozen parameter
(requires_grad False: slime's --freeze-params-name-list, or the vision tower of a run without images) that still holds
the checkpoint's value is on every engine already: an update that changes the engines' weights in place (the tensor
and distributed transports, delta weight sync) need not convert, gather and send it. A transport that writes a whole
checkpoint for the engines to load (disk, delta's full mode) still gets every tensor, as does --save-hf.

The optimizer never touches a frozen parameter, and the swaps of other weights in (old actor, reference, teacher) put
the model's back exactly; a Megatron checkpoint load (--load) may change them: then the next in-place export compares
them with --hf-checkpoint again (recheck), and they are sent with every update while they differ. (A LoRA run, whose
frozen base is every weight, sends its adapters instead and never pays for the comparison.)
"""

from __future__ import annotations

from typing import Any

import torch


class FrozenWeights:
    """The frozen parameters of an engine's model chunks, and whether they hold --hf-checkpoint's values."""

    def __init__(self, bridge: Any, model: list[torch.nn.Module]) -> None:
        self.bridge, self.model = bridge, model
        self.frozen = frozenset(id(p) for chunk in model for p in chunk.parameters() if not p.requires_grad)
        self.as_checkpoint: bool | None = True  # built right after the model loaded --hf-checkpoint; None: unknown

    def held_by_engines(self) -> frozenset[int]:
        """Ids of the frozen parameters every engine holds already (none while they differ from the checkpoint); a
        collective after a recheck."""
        if self.as_checkpoint is None:
            self.as_checkpoint = self._hold_checkpoint()
        return self.frozen if self.as_checkpoint else frozenset()

    def recheck(self) -> None:
        """After a Megatron checkpoint load: compare the frozen parameters with --hf-checkpoint again when next asked
        (on every rank, also one holding none: a pipeline stage without the vision tower takes part in the export)."""
        self.as_checkpoint = None

    def _hold_checkpoint(self) -> bool:
        """Whether the frozen parameters hold --hf-checkpoint's values (a collective: every rank compares the same
        full tensors, so all come to the same answer)."""
        from slime_like.trainer.megatron import model as model_lib
        from slime_like.trainer.megatron.hf_weights import HFCheckpoint

        others = {  # every exported tensor but the frozen ones: trained parameters and ruled buffers (expert bias)
            id(t)
            for chunk in self.model
            for t in chunk.state_dict(keep_vars=True).values()
            if torch.is_tensor(t) and id(t) not in self.frozen
        }
        checkpoint = HFCheckpoint(self.bridge.slime_like_hf_dir)
        stored = checkpoint.names()
        same = True
        for name, tensor in model_lib.export_hf_weights(self.bridge, self.model, frozenset(others)):
            # As loading cast it: the checkpoint's value at the parameter's precision (another layout or a missing
            # tensor counts as changed: sent, which is always right). Iterated to the end: a collective.
            same = same and name in stored and torch.equal(tensor.cpu(), checkpoint.get(name, name).to(tensor.dtype))
        return same
