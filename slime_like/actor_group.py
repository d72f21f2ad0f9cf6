"""The trainer ranks as Ray actors, driven together from the main loop."""

from __future__ import annotations

from typing import Any

import ray

from buffer.train_data import TrainData
from slime_like.actor import TrainActor
from slime_like.placement import Placement


@ray.remote
class _RankInfo:
    """Finds a free port on the node of trainer rank 0 (torch.distributed's rendezvous)."""

    def address(self) -> tuple[str, int]:
        from slime_like.core.process import free_port

        ip = ray.util.get_node_ip_address()
        return ip, free_port(ip)


class TrainGroup:
    """All trainer ranks; each call runs on every rank and returns rank 0's answer."""

    def __init__(self, args: Any, placement: Placement) -> None:
        self.placement = placement
        # torch.distributed's rendezvous: a free port on the node of rank 0, at the address that node registered.
        probe = _RankInfo.options(**placement.trainer_options(0, num_cpus=0.01, num_gpus=0)).remote()
        addr, port = ray.get(probe.address.remote())
        ray.kill(probe)
        remote_cls = ray.remote(TrainActor)
        self.actors = [
            remote_cls.options(**placement.trainer_options(rank)).remote(args, rank, addr, port)
            for rank in range(len(placement.trainer))
        ]

    def _all(self, method: str, *args: Any) -> Any:
        refs = [getattr(a, method).remote(*args) for a in self.actors]
        return self.placement.get(refs, f"trainer ranks ran {method}")[0]

    def train(self, rollout_id: int, data: TrainData) -> dict[str, float]:
        """One rollout's optimizer steps on every rank."""
        ref = ray.put(data)
        return self._all("train", rollout_id, ref)

    def update_weights(self, server_urls: list[str], version: int, transport: str, output_dir: str) -> float:
        """Push weights into the servers; returns seconds taken on rank 0."""
        return self._all("update_weights", server_urls, version, transport, output_dir)

    def shutdown(self, timeout: float = 60.0) -> None:
        """Every rank closes its weight channel, frees its model and leaves torch.distributed (bounded)."""
        ray.get([a.shutdown.remote() for a in self.actors], timeout=timeout)

    def touch(self, path: str) -> None:
        """Write an empty file at `path` from rank 0's node (whether engines see it tells a shared filesystem)."""
        ray.get(self.actors[0].touch.remote(path))

    def check_weights(self, server_urls: list[str], when: str) -> float:
        """The post-update check outside an update (e.g. before the first rollout); the largest difference."""
        return self._all("check_weights", server_urls, when)

    def offload(self) -> dict[str, float]:
        """Colocated on GPU: every rank moves its weights, gradients and optimizer states off the GPU; rank 0's
        memory accounting (GiB) is returned."""
        return self._all("offload")

    def onload(self) -> dict[str, float]:
        """Every rank takes them back before log-probs and training; rank 0's memory accounting."""
        return self._all("onload")

    def save(self, directory: str, iteration: int = 0) -> None:
        """Collective Megatron checkpoint into directory, recording `iteration`."""
        self._all("save", directory, iteration)

    def load(self, directory: str, load_optimizer: bool = True, load_rng: bool = True) -> None:
        """Collective Megatron checkpoint load (optimizer and RNG states when asked and present)."""
        self._all("load", directory, load_optimizer, load_rng)
