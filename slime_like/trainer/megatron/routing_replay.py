"""MoE routing replay: the trainer's routers take given experts instead of their own top-k (slime's two flags).

- `--use-rollout-routing-replay` (R3, arXiv:2510.11370): SGLang returns the experts it routed every token to and
  the old-policy log-prob and training forwards replay them, so the trainer computes through the rollout's
  experts. Near-tied router logits flip between the two engines' kernels, and a flipped expert is a leading cause
  of train/rollout log-prob mismatch on MoE models.
- `--use-routing-replay` (arXiv:2507.18071): the old-policy log-prob forward records its routing and the training
  forwards replay it, so the ratio pi/pi_old compares the same experts.
The reference (KL) and critic forwards route freely, as in slime.

Layout (SGLang's and slime's `rollout_routed_experts`): per sequence an int array [L - 1, num_layers, topk]; row t
holds, for every decoder layer, the experts token t went to. The last token has none (SGLang never feeds it; in
training its output predicts nothing), nor has padding: both get filler experts, which only they see.

Mechanism: megatron-core's RouterReplay (TransformerConfig.moe_enable_routing_replay gives each TopKRouter one).
Before each micro-batch runs on a model chunk, every router of the chunk is given its layer's target in the order
the router sees tokens (Megatron flattens [s, b]: position-major, rows interleaved; under context parallel this
rank's zig-zag positions, under sequence parallel this TP rank's part of them) with REPLAY_FORWARD; after it,
REPLAY_BACKWARD, so an activation recompute in the backward pass takes the same targets in the same order. To
record, RECORD keeps each router's last indices, read after every micro-batch and cut back into sequences.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from slime_like.trainer.megatron.context_parallel import zigzag_positions
from slime_like.trainer.megatron.packing import MicroBatch


def find_routers(chunk: torch.nn.Module) -> list[Any]:
    """The TopKRouters of one model chunk that carry a RouterReplay (config.moe_enable_routing_replay)."""
    from megatron.core.transformer.moe.router import TopKRouter

    return [m for m in chunk.modules() if isinstance(m, TopKRouter) and m.router_replay is not None]


def check_replayable(config: Any) -> None:
    """Refuse router settings whose top-k does not go through RouterReplay (the replay would be ignored)."""
    if getattr(config, "moe_router_fusion", False):
        raise ValueError("routing replay needs Megatron's unfused top-k: drop --moe-router-fusion")
    if getattr(config, "moe_router_load_balancing_type", None) == "sinkhorn":
        raise ValueError("routing replay needs top-k routing; sinkhorn load balancing picks experts another way")


def local_positions(mb: MicroBatch, cp: tuple[int, int] = (1, 0), sp: tuple[int, int] = (1, 0)) -> torch.Tensor:
    """The row positions whose tokens this rank's routers see, in their order: (cp size, rank) picks the zig-zag
    share ("thd" only), then (tp size, rank) under sequence parallel the TP rank's contiguous part."""
    positions = torch.arange(mb.tokens.shape[1])
    if cp[0] > 1:
        positions = zigzag_positions(mb.cu_seqlens, *cp)
    if sp[0] > 1:
        positions = positions.chunk(sp[0])[sp[1]]
    return positions


def filler(length: int, topk: int, num_experts: int) -> torch.Tensor:
    """[length, topk] distinct experts per position, spread over all experts (slime's padding routes)."""
    return (torch.arange(length)[:, None] * topk + torch.arange(topk)) % num_experts


def align(mb: MicroBatch, routing: Sequence[Any], num_layers: int, topk: int, num_experts: int) -> torch.Tensor:
    """The micro-batch's routing per row position, [rows, T, num_layers, topk] int64: each sequence's given
    routing on its first L - 1 positions, filler on its last token, padding and filler micro-batches."""
    rows, length = mb.tokens.shape
    full = filler(length, topk, num_experts)[None, :, None, :].expand(rows, length, num_layers, topk).clone()
    for idx, row, start, n in zip(mb.indices, mb.rows, mb.starts, mb.lengths, strict=True):
        if idx < 0:
            continue
        given = routing[idx]
        if given is None:
            raise ValueError(f"routing replay: sequence {idx} has no routing to replay")
        given = torch.as_tensor(given)
        if tuple(given.shape) != (n - 1, num_layers, topk):
            raise ValueError(
                f"routing replay: sequence {idx} of {n} tokens has routing of shape {tuple(given.shape)}, expected "
                f"[{n - 1}, {num_layers}, {topk}] (every token but the last, every layer, top-{topk})"
            )
        if given.numel() and (int(given.min()) < 0 or int(given.max()) >= num_experts):
            raise ValueError(f"routing replay: sequence {idx} names experts outside 0..{num_experts - 1}")
        full[row, start : start + n - 1] = given.to(torch.long)
    return full


def router_order(values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[rows, T, ...] per-position values -> the [tokens, ...] order one rank's router sees (s-major, then row)."""
    local = values[:, positions]
    return local.transpose(0, 1).reshape(-1, *values.shape[2:])


class RoutingReplay:
    """One forward(-backward) pass's replay or recording over the routers of an engine's model chunks."""

    def __init__(
        self,
        routers: dict[int, list[Any]],
        num_layers: int,
        topk: int,
        num_experts: int,
        routing: Sequence[Any] | None = None,
        cp: tuple[int, int] = (1, 0),
        sp: tuple[int, int] = (1, 0),
        groups: tuple[Any, Any] = (None, None),
    ) -> None:
        """routers: per model chunk (by id) its replaying routers; routing: per sequence to replay, None records.
        cp/sp: (size, rank) of context parallel and of TP under sequence parallel; groups: their process groups."""
        self.routers, self.routing = routers, routing
        self.num_layers, self.topk, self.num_experts = num_layers, topk, num_experts
        self.cp, self.sp, self.groups = cp, sp, groups
        self.recorded: dict[int, dict[int, torch.Tensor]] = {}  # sequence -> layer -> [L - 1, topk]
        self._aligned: tuple[int, torch.Tensor] | None = None  # the last micro-batch's alignment (VPP reuses it)

    def before(self, chunk: torch.nn.Module, mb: MicroBatch) -> None:
        """Give the chunk's routers this micro-batch's targets (replay) or arm them to record."""
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        routers = self.routers.get(id(chunk), [])
        if self.routing is None:
            for router in routers:
                router.router_replay.set_router_replay_action(RouterReplayAction.RECORD)
            return
        if self._aligned is None or self._aligned[0] != id(mb):
            self._aligned = (id(mb), align(mb, self.routing, self.num_layers, self.topk, self.num_experts))
        ordered = router_order(self._aligned[1], local_positions(mb, self.cp, self.sp))
        for router in routers:
            router.router_replay.set_target_indices(ordered[:, router.layer_number - 1].contiguous())
            router.router_replay.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)

    def after(self, chunk: torch.nn.Module, mb: MicroBatch) -> None:
        """After the chunk's forward: recompute in backward replays (FIFO); or keep what each router recorded."""
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        for router in self.routers.get(id(chunk), []):
            if self.routing is not None:
                router.router_replay.set_router_replay_action(RouterReplayAction.REPLAY_BACKWARD)
                continue
            indices = router.router_replay.get_recorded_indices()
            per_sequence = mb.per_sequence(self._full_rows(indices, mb))
            real = [i for i in mb.indices if i >= 0]
            for idx, values in zip(real, per_sequence, strict=True):
                self.recorded.setdefault(idx, {})[router.layer_number - 1] = values.to("cpu", torch.int32)

    def _full_rows(self, indices: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
        """A router's recorded [tokens, topk] (this rank's order) back to [rows, T, topk] of the whole row."""
        rows = mb.tokens.shape[0]
        local = indices.reshape(-1, rows, self.topk).transpose(0, 1)  # [rows, T_local, topk]
        if self.sp[0] > 1:  # sequence parallel cut last: its parts first
            local = _gather_positions(local, self.sp[0], self.groups[1])
        if self.cp[0] > 1:
            local = _gather_positions(local, self.cp[0], self.groups[0])
            order = torch.cat([zigzag_positions(mb.cu_seqlens, self.cp[0], r) for r in range(self.cp[0])])
            local = local[:, torch.argsort(order).to(local.device)]
        return local

    def finish(self) -> None:
        """Clear every router's targets, records and action (routing is free again)."""
        for routers in self.routers.values():
            for router in routers:
                router.router_replay.clear_indices()
                router.router_replay.clear_router_replay_action()

    def local_recorded(self) -> dict[int, dict[int, torch.Tensor]]:
        """What this rank recorded: sequence -> layer -> [L - 1, topk] int32."""
        return self.recorded


def _gather_positions(local: torch.Tensor, size: int, group: Any) -> torch.Tensor:
    """All ranks' [rows, T_part, topk] of a group, concatenated along positions in rank order."""
    parts = [torch.empty_like(local) for _ in range(size)]
    dist.all_gather(parts, local.contiguous(), group=group)
    return torch.cat(parts, dim=1)


def assemble(parts: list[dict[int, dict[int, torch.Tensor]]], count: int, num_layers: int, topk: int) -> list[Any]:
    """Merge ranks' recordings into per-sequence [L - 1, num_layers, topk] int32 (layers nobody recorded, the dense
    ones, stay 0); every sequence must have been recorded by some rank."""
    merged: dict[int, dict[int, torch.Tensor]] = {}
    for part in parts:
        for idx, layers in part.items():
            merged.setdefault(idx, {}).update(layers)
    out = []
    for idx in range(count):
        layers = merged.get(idx)
        if not layers:
            raise RuntimeError(f"routing replay: no rank recorded the routing of sequence {idx}")
        rows = next(iter(layers.values())).shape[0]
        full = torch.zeros(rows, num_layers, topk, dtype=torch.int32)
        for layer, values in layers.items():
            full[:, layer] = values
        out.append(full)
    return out
