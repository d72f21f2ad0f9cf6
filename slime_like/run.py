"""A training run's parts, placed by Ray: rollout manager, trainer ranks, checkpoints and metrics."""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any

import ray

from rollout.external_engines import attach_external_engines
from rollout.manager import RolloutManager
from rollout.train_handoff import RolloutResult, TrainLayout
from slime_like.actor_group import WATCH_INTERVAL, TrainGroup
from slime_like.arguments import resolve_precision
from slime_like.core.cluster import node_options
from slime_like.core.errors import ArgumentError, NodeLostError, RolloutFailedError
from slime_like.core.logs import setup_logging
from slime_like.metrics_log import MetricsLogger
from slime_like.placement import create_placement, start_ray
from slime_like.trainer.megatron import checkpoint_layout as layout
from slime_like.trainer.megatron.cpu_compat import transformer_engine_available
from slime_like.trainer.megatron.flags import no_effect_line

logger = logging.getLogger(__name__)


class Run:
    """What the loops drive; every method is one named phase of a step."""

    def __init__(self, args: Any) -> None:
        self.args = args
        setup_logging("driver", args.log_level, Path(args.output_dir) / "logs")
        for warning in getattr(args, "plan_warnings", []):  # the memory estimate: advice, not a stop
            logger.warning(warning)
        start = time.monotonic()
        start_ray(args)
        # --rollout-external-engine-addrs: servers started elsewhere, checked now (rollout/external_engines.py)
        external = attach_external_engines(args)
        self.placement = placement = create_placement(args)
        self.use_gpu = placement.use_gpu
        self._check_tensor_transport()
        logger.info(resolve_precision(args, self.use_gpu))
        no_effect = no_effect_line(args, transformer_engine_available() and self.use_gpu, self.use_gpu)
        if no_effect:  # Megatron kernel/overlap flags of slime's scripts that do nothing on this machine
            logger.info(no_effect)
        self.engines: list[dict[str, Any]] = []  # each engine's URL and nodes, once started
        # Engines start while the trainer builds its model: both are slow, neither needs the other. The manager
        # and the router stay on the driver's node.
        manager = ray.remote(RolloutManager).options(**node_options(placement.driver_node, placement.env))
        self.rollout = manager.remote(args, placement.rollout, placement.use_gpu, placement.env, server_urls=external)
        self.trainer: TrainGroup | None = None
        try:
            self._start(args, start)
        except BaseException as error:
            self._stop(lost=isinstance(error, NodeLostError))
            raise

    def _start(self, args: Any, start: float) -> None:
        """Everything after the engines were asked to start: trainer ranks, checks, resume."""
        placement = self.placement
        # --debug-rollout-only: no trainer; the steps generate (and save, with --save-debug-rollout-data) only.
        self.trainer = None if args.debug_rollout_only else TrainGroup(args, placement)
        self.server_urls = self.wait(self.rollout.server_urls.remote(), "the engines started")
        self.engines = ray.get(self.rollout.engine_layout.remote())
        lines = placement.describe(self.engines)
        logger.info("placement on %d node(s):\n%s", len(lines), "\n".join(lines))
        self._write_placement()
        if self.trainer is not None:  # rollouts are split over the trainer's DP ranks where they are generated
            dp_size, multiple = self.trainer.data_parallel()
            layout = TrainLayout(dp_size, multiple, args.global_batch_size)
            self.wait(self.rollout.set_train_layout.remote(layout), "the rollout manager took the trainer's layout")
        self._check_transports()
        self.metrics = MetricsLogger(args.output_dir, args, args.use_tensorboard, args.use_wandb)
        # Colocated on GPU the trainer's memory leaves the GPU while the servers generate (--offload-train).
        self.offload_train = args.offload_train and self.use_gpu and self.trainer is not None
        self.pending_metrics: dict[str, Any] = {"time/startup": time.monotonic() - start}
        self.weights_pushed = False  # whether the servers got the trainer's weights (and, with the flag, a check)
        self.start_rollout = self._load() if (args.load or args.ref_load) and self.trainer is not None else 0
        if getattr(args, "start_rollout_id", None) is not None:  # slime's --start-rollout-id overrides the resume's
            logger.info("--start-rollout-id: the loop starts at rollout %d", args.start_rollout_id)
            self.start_rollout = args.start_rollout_id
        if getattr(args, "lora_rank", 0) and not self.weights_pushed and self.has_both_sides:
            self.update_weights(-1)  # LoRA: the servers start with the base only; load the adapter as version 0
        once = getattr(args, "check_weight_update_equal", False)  # slime's start-up check
        if (once or args.check_weight_update and not self.weights_pushed) and self.has_both_sides:
            worst = self.trainer.check_weights(self.server_urls, "before the first rollout")
            logger.info("before the first rollout: the servers match the trainer within %.2g", worst)
        self._offload_trainer()  # before the first rollout (a resume has already offloaded after its update)
        # --release-train: the ranks end after each weight update and are rebuilt from the newest checkpoint (slime's
        # release/create); the first rollout runs beside the ranks that just built the model (nothing saved yet).
        self.release_train = bool(getattr(args, "release_train", False)) and self.trainer is not None
        self.last_save: Path | None = None

    @property
    def has_both_sides(self) -> bool:
        """Whether trainer and servers both run (not --debug-rollout-only or --debug-train-only): weights move."""
        return not (self.args.debug_rollout_only or self.args.debug_train_only)

    def wait(self, refs: Any, what: str) -> Any:
        """`ray.get`, stopping with NodeLostError (naming the node and what it held) if one of our nodes dies, and
        with TrainerRankLostError if a trainer rank dies meanwhile (idle, it would go unnoticed until its next call)."""
        trainer = getattr(self, "trainer", None)
        pending = refs if isinstance(refs, list) else [refs]
        while trainer is not None:
            ready, _ = ray.wait(pending, num_returns=len(pending), timeout=WATCH_INTERVAL)
            if len(ready) == len(pending) or self.placement.lost_nodes(self.engines):
                break  # placement.get returns the results, or raises what failed (NodeLostError for a lost node)
            trainer.check_alive(what)
        return self.placement.get(refs, what, self.engines)

    def _write_placement(self) -> None:
        """output-dir/placement.json: each trainer rank's node and pid, each engine's node and SGLang pids, the
        router."""
        router = ray.get(self.rollout.router_info.remote())
        pids = self.trainer.pids() if self.trainer is not None else []  # none with --debug-rollout-only
        record = {
            "trainer": [
                {"rank": r, "node": s.node_id, "address": s.node_ip, "pid": pid}
                for r, (s, pid) in enumerate(zip(self.placement.trainer, pids, strict=False))
            ],
            "engines": self.engines,
            "router": router,
            "model_groups": ray.get(self.rollout.model_groups.remote()),  # --sglang-config's models (or the policy)
            "driver_node": self.placement.driver_node,
        }
        path = Path(self.args.output_dir) / "placement.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".json.partial")  # rewritten after engine restarts: readers see whole files
        partial.write_text(json.dumps(record, indent=1))
        os.replace(partial, path)

    def _check_tensor_transport(self) -> None:
        """The tensor transport hands tensors over on one node: every engine must be on trainer rank 0's node
        (known from the slots, before anything starts)."""
        if "tensor" not in {self.args.update_weight_transport, self.args.update_weight_fallback}:
            return
        home = self.placement.trainer[0]
        per_engine = self.args.rollout_num_gpus_per_engine
        away = [
            f"engine {i} ({slots[0].describe()})"
            for i, slots in enumerate(self.placement.engine_slots(per_engine))
            if any(s.node_id != home.node_id for s in slots)
        ]
        if away:
            raise ArgumentError(
                f"--update-weight-transport tensor (or --update-weight-fallback tensor) hands tensors over through "
                f"shared memory on one node, but {', '.join(away)} would run on another node than trainer rank 0 "
                f"({home.describe()}): use --update-weight-transport distributed (or disk on a shared filesystem), "
                "or --colocate"
            )

    def _check_transports(self) -> None:
        """The disk transport needs a filesystem that every engine node shares with trainer rank 0: checked once,
        before any update."""
        kinds = {self.args.update_weight_transport, self.args.update_weight_fallback}
        lora = bool(getattr(self.args, "lora_rank", 0))  # LoRA adapters travel on disk too (weights/lora.py)
        if ("disk" in kinds or lora) and self.has_both_sides:
            marker = Path(self.args.output_dir).resolve() / "weights" / f".visible-{uuid.uuid4().hex[:8]}"
            self.trainer.touch(str(marker))
            try:
                unseen = ray.get(self.rollout.paths_unseen.remote(str(marker)))
            finally:
                marker.unlink(missing_ok=True)
            if unseen:
                what = "the LoRA adapter transport" if lora else "the disk weight transport"
                raise ArgumentError(
                    f"{what} writes under {marker.parent.parent} on trainer rank 0's node, but the "
                    f"engines {unseen} do not see that directory: put --output-dir on a filesystem every node "
                    "shares, or use --update-weight-transport distributed"
                )

    def generate(self, rollout_id: int) -> ray.ObjectRef:
        """Start one rollout; `ray.get` the handle for its RolloutResult (the samples stay with the manager)."""
        return self.rollout.train_batch.remote(rollout_id)

    def train(self, rollout_id: int, rollout: ray.ObjectRef) -> dict[str, Any]:
        """Wait for a rollout, then take its optimizer steps: each trainer rank fetches its own share."""
        result: RolloutResult = self.wait(rollout, f"rollout {rollout_id} generated")
        metrics = result.metrics
        if result.failure:  # training on nothing step after step would hide it
            raise RolloutFailedError(
                f"rollout {rollout_id}: {result.failure}. Generation errors point at the engines or the router "
                "(their logs under --output-dir), reward errors at the reward function (--rm-type, --custom-rm-path)."
            )
        if self.release_train and self.trainer is None:
            metrics["time/rebuild_trainer"] = self._rebuild_trainer()
        if self.trainer is None:  # --debug-rollout-only
            return metrics
        # Colocated on GPU the servers give their memory to training (on CPU the calls free nothing).
        colocated_gpu = self.args.colocate and self.use_gpu and self.args.offload_rollout is not False
        if colocated_gpu:
            ray.get(self.rollout.release_memory.remote())
        if self.offload_train:
            metrics.update(self.trainer.onload())
        metrics.update(self.trainer.train(rollout_id, result.shares))
        if colocated_gpu:
            ray.get(self.rollout.resume_memory.remote())
        return metrics

    def update_weights(self, rollout_id: int, force: bool = False) -> float:
        """Push the trained weights into every server, tagged with version rollout_id + 1, after every
        --update-weights-interval-th rollout (or when forced); then, with --offload-train, the trainer's memory
        leaves the GPU until the next train. Nothing to do without both sides (--debug-rollout-only,
        --debug-train-only)."""
        if not self.has_both_sides:
            return 0.0
        if not (force or self.weights_due(rollout_id)):
            self._offload_trainer()
            return 0.0
        behind = self._recover_engines()
        seconds = self.trainer.update_weights(
            self.server_urls, rollout_id + 1, self.args.update_weight_transport, self.args.output_dir, self._fleet(),
            behind,
        )  # fmt: skip
        if self.args.use_fault_tolerance:  # the restarted ones now hold these weights: they may serve
            ray.get(self.rollout.rejoin_engines.remote(rollout_id + 1))
        self.weights_pushed = True
        self._offload_trainer()
        if getattr(self, "release_train", False) and self.last_save is not None:
            self._release_trainer()
        return seconds

    def _release_trainer(self) -> None:
        """--release-train: every trainer rank leaves its groups and its process ends, its memory with it."""
        pids = self.trainer.pids()
        self.trainer.shutdown()
        self.trainer.kill()
        self.trainer = None
        logger.info("--release-train: trainer ranks released (pids %s) until the next train", pids)

    def _rebuild_trainer(self) -> float:
        """--release-train: new trainer ranks on the same slots, loaded from the newest checkpoint (model, optimizer
        unless --no-save-optim, RNG); with --check-weight-update, checked against the servers' weights."""
        start = time.monotonic()
        self.trainer = TrainGroup(self.args, self.placement)
        self.trainer.load(str(self.last_save), not self.args.no_save_optim, True)
        logger.info("--release-train: trainer ranks rebuilt (pids %s) from %s", self.trainer.pids(), self.last_save)
        if self.args.check_weight_update:
            worst = self.trainer.check_weights(self.server_urls, "after rebuilding the trainer")
            logger.info("after rebuilding the trainer: the servers match it within %.2g", worst)
        return time.monotonic() - start

    def weights_due(self, rollout_id: int) -> bool:
        """--update-weights-interval N: whether the weights trained at rollout_id go to the servers now."""
        if getattr(self, "release_train", False):  # slime: the released trainer's weights go out every rollout
            return True
        return (rollout_id + 1) % getattr(self.args, "update_weights_interval", 1) == 0

    def _recover_engines(self) -> list[str]:
        """--use-fault-tolerance: engines that failed a health check restart now, on their slots; placement.json
        follows their new pids. The URLs of the engines that lack the current weights (restarted ones)."""
        if not self.args.use_fault_tolerance:
            return []
        self.server_urls = self.wait(self.rollout.recover_engines.remote(), "dead engines restarted")
        engines = ray.get(self.rollout.engine_layout.remote())
        if engines != self.engines:
            self.engines = engines
            self._write_placement()
        return ray.get(self.rollout.engines_behind.remote())

    def _fleet(self) -> Any:
        """--use-fault-tolerance: the rollout manager, whose fleet judges an engine a weight update failed on."""
        return self.rollout if self.args.use_fault_tolerance else None

    def _offload_trainer(self) -> None:
        """With --offload-train on GPU: trainer memory off the GPU (no-op when already off); keep the accounting."""
        if self.offload_train:
            self.pending_metrics.update(self.trainer.offload())

    def evaluate(self, rollout_id: int, force: bool = False) -> dict[str, Any]:
        """Eval metrics when due (every --eval-interval rollouts, before the first, and when forced); none without
        servers (--debug-train-only)."""
        if self.args.debug_train_only or not self.args.eval_interval:
            return {}
        if rollout_id % self.args.eval_interval and not force:
            return {}
        if rollout_id == 0 and getattr(self.args, "skip_eval_before_train", False) and not force:
            return {}  # slime's --skip-eval-before-train
        return self.wait(self.rollout.evaluate.remote(rollout_id), f"evaluation at rollout {rollout_id}")

    def save(self, rollout_id: int) -> None:
        """Checkpoint when due, atomically, in Megatron-LM's layout: iter_<rollout id>/ with the data state."""
        interval = self.args.save_interval
        if self.trainer is None or not interval:  # --debug-rollout-only trains nothing to save
            return
        if (rollout_id + 1) % interval and rollout_id + 1 != self.args.num_rollout:
            return
        self.last_save = layout.iteration_dir(self.args.save, rollout_id)  # --release-train rebuilds from it
        with layout.saving(self.args.save, rollout_id, self.args.keep_last_n_checkpoints) as directory:
            self.trainer.save(str(directory), rollout_id)
            layout.write_state(directory, rollout_id, ray.get(self.rollout.state_dict.remote()))
        logger.info("saved %s", layout.iteration_dir(self.args.save, rollout_id))
        if getattr(self.args, "save_hf", None):  # slime's --save-hf: the policy as an HF checkpoint too
            target = self.args.save_hf.format(rollout_id=rollout_id)
            self.trainer.save_hf(target)
            logger.info("saved the policy as an HF checkpoint at %s", target)

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
        else:  # slime's checkpoint: its data position is in the file slime writes beside it, if any
            rollout_id = checkpoint.iteration
            slime_state = layout.read_slime_data_state(checkpoint)
            where = layout.slime_data_state_path(checkpoint)
            if slime_state is not None and not args.data_source_path:
                from buffer.data_source import DataSource

                source = DataSource.state_from_slime(slime_state, args.rollout_seed)
                # The buffer's state: this data position and no returned groups (slime saves none).
                ray.get(self.rollout.load_state_dict.remote({"source": source, "returned": []}))
                logger.info("--load %s: data position from slime's %s", checkpoint.directory, where)
            else:
                why = "--data-source-path keeps its own state" if slime_state else "slime saved no data position"
                logger.warning(
                    "--load %s: not written by slime-like and %s (%s): the data starts from its beginning",
                    checkpoint.directory,
                    why,
                    where,
                )
        # The servers started from the HF weights: bring them to the checkpoint's.
        self.update_weights(rollout_id, force=True)
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

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        """Close the trainer's channels while the servers still answer, then stop the servers and the router,
        also when the loop failed (briefly when a node was lost: what ran there cannot answer)."""
        self._stop(lost=exc_type is not None and issubclass(exc_type, NodeLostError))

    def _stop(self, lost: bool = False) -> None:
        if lost:  # a node died: what the error names is gone with it
            logger.error("A node of this run was lost. %s", layout.resume_advice(self.args.save))
        trainer = getattr(self, "trainer", None)
        rank_lost = trainer is not None and trainer.lost_rank is not None
        if rank_lost:
            trainer.kill()  # the live ranks may be blocked in a collective with the dead one: nothing to close
        elif trainer is not None:
            try:
                trainer.shutdown(timeout=10 if lost else 60)
            except Exception as error:  # a trainer rank may be what failed; Ray kills its process at exit
                logger.warning("trainer shutdown: %r", error)
        try:
            # After a rank died the manager may be mid-rollout (it answers calls in turn): after a short wait the
            # driver exits, and Ray ends the manager, whose servers and router die with it (PDEATHSIG).
            ray.get(self.rollout.shutdown.remote(), timeout=10 if rank_lost else 30 if lost else 120)
        except Exception as error:  # the rollout actor may be what failed; Ray then kills its processes
            logger.warning("rollout shutdown: %r", error)

    # --fully-async (python -m slime_like.train_async --fully-async; docs/fully-async.md)

    def next_batch(self, rollout_id: int) -> ray.ObjectRef:
        """The next batch of the continuous rollout, to train at weight version rollout_id (`train` waits for it)."""
        return self.rollout.next_train_batch.remote(rollout_id)

    def update_weights_in_flight(self, rollout_id: int) -> float:
        """Push the trained weights (version rollout_id + 1) while generation is paused, not drained: with
        --pause-generation-mode abort in-flight requests return their tokens and continue on the new weights,
        with retract or in_place they stay in the engines. The health checks pause first (/health hangs while
        generation is paused) and dead engines restart, as in `update_weights`."""
        args = self.args
        if not self.has_both_sides or not self.weights_due(rollout_id):
            return 0.0
        start = time.monotonic()
        behind = self._recover_engines()
        self.wait(self.rollout.pause_generation.remote(args.pause_generation_mode), "generation paused")
        try:
            self.trainer.update_weights(
                self.server_urls, rollout_id + 1, args.update_weight_transport, args.output_dir, self._fleet(), behind
            )
        finally:  # a failed update still lets generation go on (a paused server would hang every request)
            self.wait(self.rollout.continue_generation.remote(rollout_id + 1), "generation continued")
        if args.use_fault_tolerance:
            ray.get(self.rollout.rejoin_engines.remote(rollout_id + 1))
        self.weights_pushed = True
        return time.monotonic() - start
