"""The trainer ranks as Ray actors, driven together from the main loop; a rank that dies stops the run at once."""

from __future__ import annotations

import time
from typing import Any

import ray

from slime_like.placement import Placement
from slime_like.trainer.actor import TrainActor
from slime_like.trainer.megatron import checkpoint_layout as layout

WATCH_INTERVAL = 2.0  # seconds between checks for a lost node or rank while the ranks work
# Ray's causes of an actor's death that its raylet reported, so its node lives: no wait for a verdict on the node.
NODE_ALIVE_CAUSES = ("its worker process has died", "killed by `ray.kill`")
# A collective broken by a dead rank fails on the live ranks as soon as the connection drops, a little before Ray
# reports the death: a live rank's error waits this long for a rank's death to name instead.
PEER_GRACE = 5.0


class TrainerRankLostError(RuntimeError):
    """A trainer rank's process died (killed, crashed, or its actor lost by Ray); the message names the rank, its
    node and the checkpoint to resume from."""


def _death_cause(text: str) -> str:
    """The gist of Ray's account of an actor's death: its `... because ...` line, up to the worker's exit detail."""
    line = next((line.strip() for line in text.splitlines() if "because" in line), text.strip().splitlines()[0])
    return ". ".join(line.split(". ")[:3]).rstrip(".")


@ray.remote
class _RankInfo:
    """Finds a free port on the node of trainer rank 0 (torch.distributed's rendezvous)."""

    def address(self) -> tuple[str, int]:
        from slime_like.core.process import free_port

        ip = ray.util.get_node_ip_address()
        return ip, free_port(ip)


def trainer_env(options: dict[str, Any], args: Any) -> dict[str, Any]:
    """A trainer rank's Ray options with slime's --train-env-vars added to its environment (they win)."""
    extra = getattr(args, "train_env_vars", None) or {}
    if not extra:
        return options
    runtime_env = dict(options.get("runtime_env") or {})
    runtime_env["env_vars"] = {**(runtime_env.get("env_vars") or {}), **extra}
    return {**options, "runtime_env": runtime_env}


class TrainGroup:
    """All trainer ranks; each call runs on every rank and returns rank 0's answer."""

    def __init__(self, args: Any, placement: Placement) -> None:
        self.placement = placement
        self.save_dir = args.save  # where the checkpoint to resume from is, when a rank dies
        self.lost_rank: int | None = None  # a rank that died: the others cannot be shut down cleanly
        self._pids: list[int | None] = [None] * len(placement.trainer)
        self._pings: dict[int, ray.ObjectRef] = {}  # one liveness ping in flight per rank (check_alive)
        self._dp_ranks: list[int] | None = None  # each rank's data-parallel rank (data_parallel)
        # torch.distributed's rendezvous: a free port on the node of rank 0, at the address that node registered.
        probe = _RankInfo.options(**placement.trainer_options(0, num_cpus=0.01, num_gpus=0)).remote()
        addr, port = ray.get(probe.address.remote())
        ray.kill(probe)
        remote_cls = ray.remote(TrainActor)
        self.actors = [
            remote_cls.options(**trainer_env(placement.trainer_options(rank), args)).remote(args, rank, addr, port)
            for rank in range(len(placement.trainer))
        ]

    def _all(self, method: str, *args: Any) -> Any:
        refs = [getattr(a, method).remote(*args) for a in self.actors]
        return self._gather(refs, f"trainer ranks ran {method}")[0]

    def _gather(self, refs: list[ray.ObjectRef], what: str) -> list[Any]:
        """The ranks' results in rank order, as `placement.get` (NodeLostError when a node of ours died), except
        that a rank's death ends the wait at once with TrainerRankLostError: the others may be blocked in a
        collective with it, up to the process group's timeout (30 minutes, slime_like/trainer/megatron/parallel.py)."""
        rank_of = {ref: rank for rank, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=WATCH_INTERVAL)
            if not ready and self.placement.lost_nodes():
                self.placement.get(pending, what)  # raises NodeLostError naming the node and what it held
                pending = []
            for ref in ready:
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    self._rank_died(rank_of[ref], ref, exc, what)
                except Exception:
                    self._dead_peer(pending, rank_of, what)  # a dead rank is the cause to name, if there is one
                    self.placement.get(ref, what)  # re-raises the error, or NodeLostError when a lost node caused it
        return ray.get(refs)

    def _dead_peer(self, pending: list[ray.ObjectRef], rank_of: dict[ray.ObjectRef, int], what: str) -> None:
        """Raise TrainerRankLostError if one of the other ranks' calls ends in its death within PEER_GRACE s."""
        deadline = time.monotonic() + PEER_GRACE
        while pending and time.monotonic() < deadline:
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            for ref in ready:
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    self._rank_died(rank_of[ref], ref, exc, what)
                except Exception:  # the same failure on another live rank
                    pass

    def _rank_died(self, rank: int, ref: ray.ObjectRef, error: ray.exceptions.RayActorError, what: str) -> None:
        """Raise the error a dead rank means: its own start-up error, NodeLostError when its node died with it,
        else TrainerRankLostError naming the rank, its node and the checkpoint to resume from."""
        if error.actor_init_failed:  # its __init__ raised: that error (in the message) is the one to show
            raise error
        cause = str(error)
        if not any(c in cause for c in NODE_ALIVE_CAUSES):  # perhaps its node died: Ray tells that later
            try:
                self.placement.get(ref, what)  # NodeLostError when the node is gone
            except ray.exceptions.RayActorError:
                pass  # the node lives: the rank alone died
        self.lost_rank = rank
        pid = f", pid {self._pids[rank]}" if self._pids[rank] is not None else ""
        raise TrainerRankLostError(
            f"trainer rank {rank} ({self.placement.trainer[rank].describe()}{pid}) died while {what} (Ray: "
            f"{_death_cause(cause)}). The run stops: its torch.distributed group cannot take a rank back. "
            f"{layout.resume_advice(self.save_dir)}"
        ) from error

    def check_alive(self, what: str) -> None:
        """Raise TrainerRankLostError if a rank died while the driver waits on something else (the ranks are idle
        then: a dead one would go unnoticed until the next trainer call). Keeps one cheap ping per rank in flight."""
        for rank, actor in enumerate(self.actors):
            ping = self._pings.get(rank)
            if ping is None:
                self._pings[rank] = actor.pid.remote()
                continue
            ready, _ = ray.wait([ping], timeout=0)
            if not ready:
                continue
            del self._pings[rank]
            try:
                ray.get(ping)
            except ray.exceptions.RayActorError as exc:
                self._rank_died(rank, ping, exc, what)

    def pids(self) -> list[int]:
        """Each rank's process id (placement.json records them; named in the error when a rank dies)."""
        self._pids = self._gather([a.pid.remote() for a in self.actors], "trainer ranks started")
        return list(self._pids)

    def data_parallel(self) -> tuple[int, int]:
        """(DP size, the length multiple the ranks' packing pads to): how a rollout is split for them."""
        layouts = self._gather([a.data_parallel.remote() for a in self.actors], "trainer ranks reported their DP rank")
        self._dp_ranks = [dp_rank for dp_rank, _, _ in layouts]
        return layouts[0][1], layouts[0][2]

    def train(self, rollout_id: int, shares: list[ray.ObjectRef]) -> dict[str, float]:
        """One rollout's optimizer steps on every rank; each rank is handed the ref of its DP rank's share, which
        Ray fetches onto that rank's node alone (the driver never holds the data)."""
        if self._dp_ranks is None:
            self.data_parallel()
        if len(shares) != max(self._dp_ranks) + 1:
            raise ValueError(f"{len(shares)} rollout shares for {max(self._dp_ranks) + 1} data-parallel ranks")
        refs = [a.train.remote(rollout_id, shares[d]) for a, d in zip(self.actors, self._dp_ranks, strict=True)]
        return self._gather(refs, "trainer ranks ran train")[0]

    def update_weights(
        self,
        server_urls: list[str],
        version: int,
        transport: str,
        output_dir: str,
        fleet: Any = None,
        behind: list[str] | None = None,
    ) -> float:
        """Push weights into the servers (`fleet`: the rollout manager, judge of engines that die meanwhile; `behind`:
        servers restarted since they got weights); returns seconds taken on rank 0."""
        return self._all("update_weights", server_urls, version, transport, output_dir, fleet, behind)

    def shutdown(self, timeout: float = 60.0) -> None:
        """Every rank closes its weight channel, frees its model and leaves torch.distributed (bounded)."""
        ray.get([a.shutdown.remote() for a in self.actors], timeout=timeout)

    def kill(self) -> None:
        """End every rank's process now (after a rank died the others may be blocked in a collective with it)."""
        for actor in self.actors:
            ray.kill(actor, no_restart=True)

    def touch(self, path: str) -> None:
        """Write an empty file at `path` from rank 0's node (whether engines see it tells a shared filesystem)."""
        self._gather([self.actors[0].touch.remote(path)], "trainer rank 0 wrote a file")

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

    def save_hf(self, directory: str) -> None:
        """Collective export of the policy as an HF checkpoint into directory (--save-hf; rank 0 writes)."""
        self._all("save_hf", directory)

    def load(self, directory: str, load_optimizer: bool = True, load_rng: bool = True) -> None:
        """Collective Megatron checkpoint load (optimizer and RNG states when asked and present)."""
        self._all("load", directory, load_optimizer, load_rng)
