"""A training run's parts, placed by Ray: rollout manager, trainer ranks, checkpoints and metrics."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import ray

from buffer.train_data import build_train_data
from rollout.manager import RolloutManager
from slime_like.actor_group import TrainGroup
from slime_like.arguments import resolve_precision
from slime_like.core.logs import setup_logging
from slime_like.megatron import checkpoint_layout as layout
from slime_like.megatron.cpu_compat import transformer_engine_available
from slime_like.megatron.flags import no_effect_line
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
        logger.info(resolve_precision(args, self.use_gpu))
        no_effect = no_effect_line(args, transformer_engine_available() and self.use_gpu, self.use_gpu)
        if no_effect:  # Megatron kernel/overlap flags of slime's scripts that do nothing on this machine
            logger.info(no_effect)
        # Servers start while the trainer builds its model: both are slow, neither needs the other.
        manager = ray.remote(RolloutManager).options(**placement.options(placement.rollout_bundle, num_gpus=0))
        self.rollout = manager.remote(args, placement.rollout_gpu_offset)
        self.trainer = TrainGroup(args, placement)
        self.server_urls = ray.get(self.rollout.server_urls.remote())
        self.metrics = MetricsLogger(args.output_dir, args, args.use_tensorboard, args.use_wandb)
        # Colocated on GPU the trainer's memory leaves the GPU while the servers generate (--offload-train).
        self.offload_train = args.offload_train and self.use_gpu
        self.pending_metrics: dict[str, Any] = {}  # reported with the next step's metrics
        self.weights_pushed = False  # whether the servers got the trainer's weights (and, with the flag, a check)
        self.start_rollout = self._load() if args.load or args.ref_load else 0
        if args.check_weight_update and not self.weights_pushed:
            worst = self.trainer.check_weights(self.server_urls, "before the first rollout")
            logger.info("before the first rollout: the servers match the trainer within %.2g", worst)
        self._offload_trainer()  # before the first rollout (a resume has already offloaded after its update)

    def generate(self, rollout_id: int) -> ray.ObjectRef:
        """Start one rollout; `ray.get` the handle for (groups, metrics)."""
        return self.rollout.generate.remote(rollout_id)

    def train(self, rollout_id: int, rollout: ray.ObjectRef) -> dict[str, Any]:
        """Wait for a rollout, turn it into training data and take this rollout's optimizer steps."""
        groups, metrics = ray.get(rollout)
        data = build_train_data(groups, reward_key=self.args.reward_key)
        # Colocated on GPU the servers give their memory to training (on CPU the calls free nothing).
        colocated_gpu = self.args.colocate and self.use_gpu and self.args.offload_rollout is not False
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
        self.weights_pushed = True
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
        """Checkpoint when due, atomically, in Megatron-LM's layout: iter_<rollout id>/ with the data state."""
        interval = self.args.save_interval
        if not interval or ((rollout_id + 1) % interval and rollout_id + 1 != self.args.num_rollout):
            return
        with layout.saving(self.args.save, rollout_id, self.args.keep_last_n_checkpoints) as directory:
            self.trainer.save(str(directory), rollout_id)
            layout.write_state(directory, rollout_id, ray.get(self.rollout.state_dict.remote()))
        logger.info("saved %s", layout.iteration_dir(self.args.save, rollout_id))

    def _load(self) -> int:
        """Resume from --load (a run directory or one checkpoint, ours or slime's); with no checkpoint there, take
        the weights of --ref-load, as slime does. Returns the next rollout id."""
        args = self.args
        found = args.load and os.path.isdir(args.load)  # slime's scripts pass a new --save directory as --load
        checkpoint = layout.find_checkpoint(args.load, "--load") if found else None
        if checkpoint is None:
            where = f"--load {args.load} holds no checkpoint (no {layout.TRACKER})" if args.load else "no --load"
            if not args.ref_load:
                logger.info("%s: starting from --hf-checkpoint at rollout 0", where)
                return 0
            checkpoint = layout.require_checkpoint(args.ref_load, "--ref-load")
            logger.info(
                "%s: starting from the weights of --ref-load %s at rollout 0, optimizer fresh",
                where,
                checkpoint.directory,
            )
            return self._start_from_weights(checkpoint)
        if checkpoint.note:
            logger.warning(checkpoint.note)
        if args.finetune or checkpoint.release:
            why = "--finetune" if args.finetune else "a release checkpoint"
            logger.info("--load %s (%s): model weights only, from rollout 0", checkpoint.directory, why)
            return self._start_from_weights(checkpoint)
        self.trainer.load(str(checkpoint.directory), not args.no_load_optim, not args.no_load_rng)
        state = checkpoint.state()
        if state is not None:
            rollout_id = state["rollout_id"]
            ray.get(self.rollout.load_state_dict.remote(state["rollout_state"]))
        else:
            rollout_id = checkpoint.iteration
            logger.warning(
                "--load %s: not written by slime-like (no %s), so the data position was not saved; the data "
                "starts from its beginning (slime's rollout/global_dataset_state_dict_*.pt is not read)",
                checkpoint.directory,
                layout.STATE_FILE,
            )
        # The servers started from the HF weights: bring them to the checkpoint's.
        self.update_weights(rollout_id)
        logger.info("resumed from %s at rollout %d", checkpoint.directory, rollout_id + 1)
        return rollout_id + 1

    def _start_from_weights(self, checkpoint: layout.Checkpoint) -> int:
        """A checkpoint's model weights with a fresh optimizer and the data from its start: rollout 0 is next."""
        self.trainer.load(str(checkpoint.directory), load_optimizer=False, load_rng=False)
        self.update_weights(-1)  # the servers started from --hf-checkpoint: weight version 0, these weights
        return 0

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
        """Close the trainer's channels while the servers still answer, then stop the servers and the router,
        also when the loop failed."""
        try:
            self.trainer.shutdown()
        except Exception as error:  # a trainer rank may be what failed; Ray kills its process at exit
            logger.warning("trainer shutdown: %r", error)
        try:
            ray.get(self.rollout.shutdown.remote(), timeout=120)
        except Exception as error:  # the rollout actor may be what failed; Ray then kills its processes
            logger.warning("rollout shutdown: %r", error)
