"""A training run's parts, placed by Ray: rollout manager, trainer ranks, checkpoints and metrics."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import ray

from buffer.train_data import build_train_data
from rollout.manager import RolloutManager
from slime_like.actor_group import TrainGroup
from slime_like.core.logs import setup_logging
from slime_like.metrics_log import MetricsLogger
from slime_like.placement import create_placement, start_ray

logger = logging.getLogger(__name__)


class Run:
    """What the loops drive; every method is one named phase of a step."""

    def __init__(self, args: Any) -> None:
        self.args = args
        setup_logging("driver", args.log_level, Path(args.output_dir) / "logs")
        start_ray(args)
        placement = create_placement(args)
        self.use_gpu = placement.use_gpu
        # Servers start while the trainer builds its model: both are slow, neither needs the other.
        manager = ray.remote(RolloutManager).options(**placement.options(placement.rollout_bundle, num_gpus=0))
        self.rollout = manager.remote(args, placement.rollout_gpu_offset)
        self.trainer = TrainGroup(args, placement)
        self.server_urls = ray.get(self.rollout.server_urls.remote())
        self.metrics = MetricsLogger(args.output_dir, args, args.use_tensorboard, args.use_wandb)
        # Colocated on GPU the trainer's memory leaves the GPU while the servers generate (--offload-train).
        self.offload_train = args.offload_train and self.use_gpu
        self.pending_metrics: dict[str, Any] = {}  # reported with the next step's metrics
        self.start_rollout = self._load() if args.load else 0
        self._offload_trainer()  # before the first rollout (a resume has already offloaded after its update)

    def generate(self, rollout_id: int) -> ray.ObjectRef:
        """Start one rollout; `ray.get` the handle for (groups, metrics)."""
        return self.rollout.generate.remote(rollout_id)

    def train(self, rollout_id: int, rollout: ray.ObjectRef) -> dict[str, Any]:
        """Wait for a rollout, turn it into training data and take this rollout's optimizer steps."""
        groups, metrics = ray.get(rollout)
        data = build_train_data(groups, reward_key=self.args.reward_key)
        # Colocated on GPU the servers give their memory to training (on CPU the calls free nothing).
        colocated_gpu = self.args.colocate and self.use_gpu
        if colocated_gpu:
            ray.get(self.rollout.release_memory.remote())
        if self.offload_train:
            metrics.update(self.trainer.onload())
        metrics.update(self.trainer.train(rollout_id, data))
        if colocated_gpu:
            ray.get(self.rollout.resume_memory.remote())
        return metrics

    def update_weights(self, rollout_id: int) -> float:
        """Push the trained weights into every server, tagged with version rollout_id + 1; then, with
        --offload-train, the trainer's memory leaves the GPU until the next train."""
        seconds = self.trainer.update_weights(
            self.server_urls, rollout_id + 1, self.args.update_weight_transport, self.args.output_dir
        )
        self._offload_trainer()
        return seconds

    def _offload_trainer(self) -> None:
        """With --offload-train on GPU: trainer memory off the GPU (no-op when already off); keep the accounting."""
        if self.offload_train:
            self.pending_metrics.update(self.trainer.offload())

    def evaluate(self, rollout_id: int, force: bool = False) -> dict[str, Any]:
        """Eval metrics when due (every --eval-interval rollouts, before the first, and when forced)."""
        if not self.args.eval_interval or (rollout_id % self.args.eval_interval and not force):
            return {}
        return ray.get(self.rollout.evaluate.remote(rollout_id))

    def save(self, rollout_id: int) -> None:
        """Checkpoint when due: Megatron state, buffer state and where to resume."""
        interval = self.args.save_interval
        if not interval or ((rollout_id + 1) % interval and rollout_id + 1 != self.args.num_rollout):
            return
        target = Path(self.args.save) / f"rollout_{rollout_id:06d}"
        self.trainer.save(str(target / "megatron"))
        state = ray.get(self.rollout.state_dict.remote())
        (target / "rollout_state.json").write_text(json.dumps(state))
        (target / "meta.json").write_text(json.dumps({"rollout_id": rollout_id}))
        (Path(self.args.save) / "latest").write_text(target.name)

    def _load(self) -> int:
        """Resume from --load (a run's save dir or one checkpoint in it); returns the next rollout id."""
        root = Path(self.args.load)
        target = root / (root / "latest").read_text().strip() if (root / "latest").exists() else root
        if not (target / "meta.json").exists():
            raise FileNotFoundError(f"--load {root}: no checkpoint there (no meta.json or latest file)")
        rollout_id = json.loads((target / "meta.json").read_text())["rollout_id"]
        self.trainer.load(str(target / "megatron"))
        ray.get(self.rollout.load_state_dict.remote(json.loads((target / "rollout_state.json").read_text())))
        # The servers started from the HF weights: bring them to the checkpoint's.
        self.update_weights(rollout_id)
        logger.info("resumed from %s at rollout %d", target, rollout_id + 1)
        return rollout_id + 1

    def log(self, rollout_id: int, metrics: dict[str, Any], step_start: float | None = None) -> None:
        """Record the step's metrics and any pending offload accounting (nothing when there are none); with a
        start time, also the step time."""
        metrics = {**self.pending_metrics, **metrics}
        self.pending_metrics = {}
        if not metrics:
            return
        if step_start is not None:
            metrics["time/step"] = time.monotonic() - step_start
        self.metrics.log(rollout_id, metrics)

    def finish(self) -> None:
        """Evaluate the final weights and plot the curves."""
        self.log(self.args.num_rollout, self.evaluate(self.args.num_rollout, force=True))
        path = self.metrics.plot()
        if path:
            print(f"curves: {path}", flush=True)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop the servers and the router, also when the loop failed."""
        try:
            ray.get(self.rollout.shutdown.remote(), timeout=120)
        except Exception as error:  # the rollout actor may be what failed; Ray then kills its processes
            logger.warning("rollout shutdown: %r", error)
