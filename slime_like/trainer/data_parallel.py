"""The RL step's collectives over a trainer rank's data-parallel group."""

from __future__ import annotations

from typing import Any

import torch

from buffer.train_data import RankShare


class DataParallel:
    """The RL step's collectives (rl_step.Collectives) over this rank's data-parallel group."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def rows(self, share: RankShare, values: list[float]) -> list[float]:
        """One number per sample of this rank's share -> one per sample of the rollout, in rollout order.

        One all-reduce over the DP group of a vector that each rank fills at its own rows only: every entry is
        one rank's number plus zeros, so the result is exact, and sums over it add in a single process's order."""
        full = torch.zeros(len(share.rollout), dtype=torch.float64, device=self.device)
        if share.rows:
            full[share.rows] = torch.tensor(values, dtype=torch.float64, device=self.device)
        if share.dp_size > 1:
            from megatron.core import parallel_state as mpu

            torch.distributed.all_reduce(full, group=mpu.get_data_parallel_group())
        return full.tolist()

    def objects(self, obj: Any) -> list[Any]:
        """`obj` of every DP rank, in rank order (all_gather_object)."""
        from megatron.core import parallel_state as mpu

        parts: list[Any] = [None] * mpu.get_data_parallel_world_size()
        torch.distributed.all_gather_object(parts, obj, group=mpu.get_data_parallel_group())
        return parts
