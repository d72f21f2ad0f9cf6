"""Routed experts an HF checkpoint stores stacked: one tensor per layer and projection, experts on dim 0.

Qwen3-VL-MoE's published checkpoints hold `mlp.experts.gate_up_proj` [experts, hidden, 2 x inter] (gate columns
first) and `mlp.experts.down_proj` [experts, inter, hidden]; SGLang's loader reads exactly that layout (it transposes
every expert). transformers 5 keeps the transposes in memory ([experts, 2 x inter, hidden], [experts, hidden, inter])
and its save_pretrained writes them so; its loader takes either by shape. Megatron keeps one fc1 / fc2 per expert
(local_experts.{e}), so a family rule of kind expert_gate_up / expert_down names the stacked tensor and each Megatron
expert is one slice of it (conversion.py transposes the published slice). Loading reads only the slice
(safetensors' get_slice), either layout; an export stacks every expert back and writes the published layout, the one
SGLang's weight updates and the Hub's checkpoints have.
"""

from __future__ import annotations

from typing import Any

import torch

from slime_like.trainer.megatron.conversion import EXPERT_SLICES


def read_expert(checkpoint: Any, name: str, expert: int, kind: str, hidden: int, wanted_by: str) -> torch.Tensor:
    """Expert `expert`'s slice of a stacked tensor of an HFCheckpoint, in the published layout (transformers 5's
    transposed layout is turned back; a square slice is taken as published, as SGLang takes it)."""
    part = checkpoint.get_slice(name, wanted_by)[expert]
    # Published: gate_up [hidden, 2 x inter], down [inter, hidden]; transformers 5 saves their transposes.
    published = part.shape[0] == hidden if kind == "expert_gate_up" else part.shape[1] == hidden
    return part if published else part.t()


class ExpertStacks:
    """Collects the exported slices of stacked experts tensors and hands each tensor over once every expert is in."""

    def __init__(self, num_experts: int) -> None:
        self.num_experts = num_experts
        self._parts: dict[str, dict[int, torch.Tensor]] = {}

    def add(self, kind: str, name: str, expert: int | None, value: torch.Tensor) -> torch.Tensor | None:
        """The tensor to yield for (name, value): itself when not stacked, else the stack once complete (None before)."""
        if kind not in EXPERT_SLICES:
            return value
        parts = self._parts.setdefault(name, {})
        parts[expert] = value
        if len(parts) < self.num_experts:
            return None
        del self._parts[name]
        return torch.stack([parts[e] for e in range(self.num_experts)])

    def check_complete(self) -> None:
        """A ValueError for a stacked tensor the export left incomplete (`skip` took some of its experts: a frozen
        part of a layer's experts), which would otherwise be missing from the export without a word."""
        for name, parts in self._parts.items():
            raise ValueError(
                f"{name} stacks {self.num_experts} experts but the export holds {len(parts)} of them: an in-place "
                "update sends a stacked experts tensor whole, so freeze all of a layer's experts or none"
            )
