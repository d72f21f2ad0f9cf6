"""One trainer rank (a Ray actor): the Megatron policy (and, for PPO, critic) engines and the weight transports.

A rollout's step: recompute the old policy's log-probs (and the reference's, the critic's values, the teacher's)
on this rank's share of the rollout (buffer.train_data.RankShare: the rollout manager split the rollout, each
step token-balanced over the ranks), fill the share's batch with advantages and weights (the RL step's arithmetic:
slime_like/trainer/algorithms/rl_step.py), then take one optimizer step per --global-batch-size chunk of that batch
with the loss function of --loss-type (slime_like/trainer/algorithms/step_hooks.py).
"""

from __future__ import annotations

import gc
import logging
import os
import time
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import torch

from buffer.group_rewards import RewardShaping, shape_rewards
from buffer.train_data import RankShare, TrainData, split_by_dp
from slime_like.core.logs import setup_logging
from slime_like.trainer.algorithms.loss import value_loss_fn
from slime_like.trainer.algorithms.rl_step import Forwards, RLStep, every_sample
from slime_like.trainer.algorithms.step_hooks import ADVANTAGE_FLAG, LOSS_FLAG, load_step_hooks
from slime_like.trainer.data_parallel import DataParallel
from slime_like.trainer.hooks import load_trainer_hooks
from slime_like.trainer.rollout_entropy import old_policy_forward

logger = logging.getLogger(__name__)


def _response(full: list[torch.Tensor], lengths: list[int]) -> list[torch.Tensor]:
    """The response part (last n entries) of per-sequence engine outputs."""
    return [x[-n:] for x, n in zip(full, lengths, strict=True)]


class TrainActor:
    """A trainer rank; it trains on its data-parallel share of each rollout."""

    def __init__(self, args: Any, rank: int, master_addr: str, master_port: int) -> None:
        os.environ.update(
            RANK=str(rank),
            WORLD_SIZE=str(args.world_size),
            LOCAL_RANK=str(rank % args.actor_num_gpus_per_node),
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
        )
        # First, so that Megatron's import-time notes are logged (once per run: rank 0's console).
        setup_logging("trainer", args.log_level, Path(args.output_dir) / "logs")
        from slime_like.trainer.megatron.engine import MegatronTrainEngine
        from slime_like.trainer.megatron.offload import TrainerOffload, materialize_optimizer_state
        from slime_like.trainer.megatron.parallel import init_parallel

        self.args = args
        self.master_addr = master_addr  # kept: the environment may change after start (a caller restoring its own)
        self.rank = rank
        init_parallel(
            args.tensor_model_parallel_size,
            args.pipeline_model_parallel_size,
            args.expert_model_parallel_size,
            seed=args.seed,
            cp=args.context_parallel_size,
            sequence_parallel=args.sequence_parallel,
            reloadable_groups=bool(getattr(args, "offload_train", False)) and torch.cuda.is_available(),
            timeout_minutes=getattr(args, "distributed_timeout_minutes", 10),
            gpu_backend=getattr(args, "distributed_backend", "nccl"),
        )
        self.hooks = load_trainer_hooks(args)
        if self.hooks.init is not None:
            self.hooks.init(args)  # slime: after the parallel groups, before the model
        from slime_like.trainer.megatron.cpu_compat import transformer_engine_available
        from slime_like.trainer.megatron.flags import model_config_overrides, mtp_engine_args
        from slime_like.trainer.megatron.local_kernels_flags import local_kernels_from_args
        from slime_like.trainer.megatron.lora import lora_settings
        from slime_like.trainer.train_options import freeze_callback, trainable_filter

        common = {
            "max_tokens_per_micro_batch": args.max_tokens_per_gpu,
            "dtype": torch.bfloat16 if args.bf16 else torch.float32,
            # recompute, dropout and kernel flags (slime_like/trainer/megatron/flags.py) -> TransformerConfig
            **model_config_overrides(args, transformer_engine_available(), torch.cuda.is_available()),
            # --local-fused-elementwise, --local-grouped-experts (slime_like/trainer/megatron/local_kernels_flags.py)
            "local_kernels": local_kernels_from_args(
                args, cuda=torch.cuda.is_available(), transformer_engine=transformer_engine_available()
            ),
            # A VL model's vision tower trains in runs that read images (--multimodal-keys); frozen otherwise.
            "train_vision": bool(getattr(args, "multimodal_keys", None)),
        }
        # Colocated on GPU, what is built in this region leaves the GPU while the servers generate.
        self.memory = TrainerOffload(args.offload_train, rebuild_groups=True)
        # MoE routing replay (slime_like/trainer/megatron/routing_replay.py): the policy's routers can take given experts.
        replay = {"moe_enable_routing_replay": True} if getattr(args, "use_routing_replay", False) else {}
        with self.memory.region():
            self.engine = MegatronTrainEngine(
                args.hf_checkpoint,
                self._optimizer_settings(args.lr),
                temperature=args.rollout_temperature,
                **common,
                **replay,
                **mtp_engine_args(args),  # --enable-mtp-training: the MTP layers are built and trained
                lora=lora_settings(args),  # --lora-rank: adapters trained on a frozen base (megatron/lora.py)
                # --only-train-params-name-list, --freeze-params-name-list, --freeze-indexer (train_options.py)
                freeze=(trains := trainable_filter(args))
                and freeze_callback(trains, getattr(args, "freeze_indexer", 0)),
            )
            if getattr(args, "lora_adapter_path", None):
                self.engine.load_adapter(args.lora_adapter_path)
            from slime_like.trainer.megatron.lora_slots import adapter_slots

            self.lora_slots = adapter_slots(self.engine, args)  # --multi-lora-adapter: one adapter per name
            # PPO's critic: a second engine on the same ranks and parallel layout, the policy's trunk with a
            # value head (mbridge's value model), its own optimizer and learning rate.
            self.critic = None
            if args.advantage_estimator == "ppo" and args.loss_type != "sft_loss":
                critic_lr = args.critic_lr if args.critic_lr is not None else args.lr
                self.critic = MegatronTrainEngine(
                    args.hf_checkpoint, self._optimizer_settings(critic_lr), value_head=True, **common
                )
            # The reference policy is a frozen copy of the starting (or --ref-load) weights, swapped in for its forward.
            self.ref_weights = self._reference_weights() if args.use_kl_loss or args.kl_coef else None
            # --opd-type megatron: the teacher, the same architecture with other weights, is swapped in the same way.
            self.teacher_weights = None
            if getattr(args, "use_opd", False) and args.opd_type == "megatron":
                step = getattr(args, "opd_teacher_ckpt_step", None)
                self.teacher_weights = self._checkpoint_weights(args.opd_teacher_load, "--opd-teacher-load", step)
            # --keep-old-actor: the weights that generated each rollout score its old-policy log-probs (old_actor.py).
            self.old_actor = None
            if getattr(args, "keep_old_actor", False):
                from slime_like.trainer.old_actor import OldActor

                self.old_actor = OldActor(self._live, args.update_weights_interval)
            if self.memory.enabled:  # Adam's moments would otherwise appear at the first step, outside the region
                for engine in (self.engine, self.critic):
                    if engine is not None:
                        materialize_optimizer_state(engine.optimizer)
        # The loss and advantage hooks, slime's adapted to our contract once (step_hooks.py).
        self.step_hooks = load_step_hooks(args)
        self.loss_fn = self.step_hooks.loss_fn
        self.slime_loss = self.step_hooks.follows_slime(LOSS_FLAG)
        self.slime_advantage = self.step_hooks.follows_slime(ADVANTAGE_FLAG)
        self.step = RLStep(args, self.step_hooks, DataParallel(self.engine.device))
        # Entropy is only a metric unless the loss uses it: then it needs no [tokens, vocab] backward.
        self.entropy_grad = args.loss_type == "custom_loss" or bool(args.entropy_coef)
        self.transport = None
        self.transport_urls: list[str] = []  # the servers the transport was made for
        self.transport_kind = ""  # and its kind (--update-weight-transport)

    def _optimizer_settings(self, lr: float):
        from slime_like.trainer.megatron.cpu_compat import transformer_engine_available
        from slime_like.trainer.megatron.flags import optimizer_settings

        cuda = torch.cuda.is_available()
        return optimizer_settings(self.args, lr, self.steps_per_rollout, cuda, transformer_engine_available())

    @property
    def steps_per_rollout(self) -> int:
        """Optimizer steps per rollout (samples per rollout / --global-batch-size)."""
        return self.args.rollout_batch_size * self.args.n_samples_per_prompt // self.args.global_batch_size

    def _reference_weights(self) -> dict[str, torch.Tensor]:
        """The KL reference: the weights of the --ref-load checkpoint, else the starting (--hf-checkpoint) ones."""
        if not self.args.ref_load:
            return self._snapshot()
        return self._checkpoint_weights(self.args.ref_load, "--ref-load", getattr(self.args, "ref_ckpt_step", None))

    def _before_log_prob(self, store_prefix: str) -> None:
        """--custom-megatron-before-log-prob-hook-path, with slime's store prefix of the forward that follows."""
        if self.hooks.before_log_prob is not None:
            self.hooks.before_log_prob(self.args, self.engine.model, store_prefix)

    def _checkpoint_weights(self, path: str, flag: str, step: int | None = None) -> dict[str, torch.Tensor]:
        """The model weights of the Megatron checkpoint at `path` (named by `flag`), read through the policy's
        model, whose own weights are put back."""
        from slime_like.trainer.megatron.checkpoint_layout import require_checkpoint

        start = self._snapshot()
        checkpoint = require_checkpoint(path, flag, step)
        self.engine.load_model_weights(checkpoint.directory)
        weights = self._snapshot()
        self._load_weights(start)  # the policy starts where --hf-checkpoint (or a later --load) puts it
        logger.info("%s weights: %s", flag, checkpoint.directory)
        return weights

    def _snapshot(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self._live().items()}

    def _live(self) -> dict[str, torch.Tensor]:
        """The policy's own weight tensors by name (writing into them changes the model)."""
        return {k: v for m in self.engine.model for k, v in m.state_dict().items() if torch.is_tensor(v)}

    def _forward_with_weights(self, weights: dict[str, torch.Tensor], data: TrainData) -> list[torch.Tensor]:
        """Log-probs of this rank's share under other weights (the reference), then put the current ones back."""
        current = self._snapshot()
        self._load_weights(weights)
        try:
            return self.engine.forward_logprobs(
                data.tokens, local=True, multimodal=data.multimodal_train_inputs or None
            )
        finally:
            self._load_weights(current)

    def _load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for m in self.engine.model:
                for k, v in m.state_dict().items():
                    if k in weights and torch.is_tensor(v):
                        v.copy_(weights[k])

    def data_parallel(self) -> tuple[int, int, int]:
        """(DP rank, DP size, the multiple sequence lengths are padded to in micro-batches): how the rollout side
        splits a rollout for this rank (buffer.train_data.split_by_dp)."""
        from megatron.core import parallel_state as mpu

        multiple = self.engine.pad_multiple if self.engine.layout == "thd" else 1
        return mpu.get_data_parallel_rank(), mpu.get_data_parallel_world_size(), multiple

    def train(self, rollout_id: int, data: RankShare | TrainData) -> dict[str, float]:
        """Prepare this rank's share of the rollout (log-probs, values, advantages), then take this rollout's
        optimizer steps. A whole rollout (TrainData) is split here as the rollout side would split it."""
        share = data if isinstance(data, RankShare) else self._own_share(data)
        dp_rank, dp_size, _ = self.data_parallel()
        if (share.dp_rank, share.dp_size) != (dp_rank, dp_size):
            raise ValueError(
                f"trainer rank {self.rank} is data-parallel rank {dp_rank} of {dp_size}, but was handed the share of "
                f"rank {share.dp_rank} of {share.dp_size}"
            )
        if len(share.rollout) == 0:  # every sample failed or was filtered out: nothing to learn from
            logger.warning("rollout %d: no usable samples, no optimizer step", rollout_id)
            return {}
        if getattr(self.args, "reset_optimizer_states", False):  # slime: Adam starts afresh every rollout
            from slime_like.trainer.train_options import reset_optimizer_states

            reset_optimizer_states(self.engine.optimizer)
        if self.lora_slots is not None:  # multi-LoRA: each adapter steps on its own samples alone (lora_slots.py)
            metrics = self.lora_slots.train_each(share, partial(self._train_share, rollout_id))
        else:
            metrics = self._train_share(rollout_id, share)
        interval = getattr(self.args, "ref_update_interval", None)
        if interval and self.ref_weights is not None and (rollout_id + 1) % interval == 0:
            self.ref_weights = self._snapshot()  # --ref-update-interval: the reference becomes the trained policy
            logger.info("rollout %d: the KL reference is now the trained policy (--ref-update-interval)", rollout_id)
        return metrics

    def _train_share(self, rollout_id: int, share: RankShare) -> dict[str, float]:
        """Fill the share's batch (log-probs, values, advantages), then take its optimizer steps."""
        start = time.monotonic()
        sft = self.args.loss_type == "sft_loss"
        if sft:
            batch, metrics, routing = share.data, {}, None
        else:
            forwards, routing = self._forwards(share)
            batch, metrics = self.step.rl_batch(share, forwards)
        batch = self.hooks.postprocess(self.args, rollout_id, batch)
        # Loss tokens of every sample of the rollout: each step's aggregation counts its sequences and tokens.
        counts = self.step.loss_tokens(share, batch)
        prepare_time = time.monotonic() - start
        # Critic warm-up: the first --num-critic-only-steps rollouts leave the policy as it is.
        train_policy = rollout_id >= self.args.num_critic_only_steps
        step_metrics: list[dict[str, float]] = []
        for step_id, (bounds, idx) in enumerate(zip(share.step_bounds, share.steps, strict=True)):
            step_batch = self.step.step_batch(batch.select(idx), counts, bounds)
            tokens = step_batch.tokens
            step: dict[str, float] = {}
            if self.critic is not None:
                out = self.critic.train_step(tokens, step_batch, value_loss_fn(self.args), local=True)
                step.update({f"critic/{k}": v for k, v in out.items()})
            if train_policy:
                if self.hooks.before_train_step is not None:
                    engine = self.engine
                    hook = self.hooks.before_train_step
                    hook(self.args, rollout_id, step_id, engine.model, engine.optimizer, engine.scheduler)
                out = self.engine.train_step(
                    tokens,
                    step_batch,
                    self.loss_fn,
                    with_entropy=not sft,
                    entropy_grad=self.entropy_grad,
                    routing=None if routing is None else [routing[i] for i in idx],
                    local=True,
                    mtp_loss_masks=None if self.engine.mtp is None else self.engine.mtp.loss_masks(step_batch),
                )
                step.update({f"train/{k}": v for k, v in out.items()})
            step_metrics.append(step)
        metrics.update(self.step.step_means(step_metrics))
        metrics["time/logprob"] = prepare_time
        metrics["time/train"] = time.monotonic() - start - prepare_time
        return metrics

    def _own_share(self, data: TrainData) -> RankShare:
        """This rank's share of a whole rollout, shaped and split as the rollout manager does."""
        dp_rank, dp_size, multiple = self.data_parallel()
        shaped = shape_rewards(data, RewardShaping.from_args(self.args))
        return split_by_dp(shaped, dp_size, self.args.global_batch_size, multiple)[dp_rank]

    def _forwards(self, share: RankShare) -> tuple[Forwards, list[Any] | None]:
        """The engines' forwards of this rank's share (old and reference log-probs, the critic's values, the
        teacher's log-probs), and the routing the training forwards replay (None: no routing replay)."""
        args, data = self.args, share.data
        lengths = data.response_lengths
        # Routing replay, as slime: R3 replays the rollout's experts in the old-policy and training forwards;
        # --use-routing-replay records the old-policy forward's and replays them in training. Ref and critic route.
        routing = self._rollout_routing(share) if getattr(args, "use_rollout_routing_replay", False) else None
        self._before_log_prob("")
        with self.old_actor.swapped_in() if self.old_actor is not None else nullcontext():  # --keep-old-actor
            images = data.multimodal_train_inputs or None  # a vision-language batch's images, per sample
            old_full, entropy, routing = old_policy_forward(self.engine, args, data.tokens, routing, images)
        old_lp = _response(old_full, lengths)
        ref_lp = None
        if self.ref_weights is not None:
            self._before_log_prob("ref_")
            ref_lp = _response(self._forward_with_weights(self.ref_weights, data), lengths)
        values = None
        if self.critic is not None:
            values = _response(
                self.critic.forward_values(data.tokens, local=True, multimodal=data.multimodal_train_inputs or None),
                lengths,
            )
        teacher = self._teacher_log_probs(share) if args.use_opd else None
        return Forwards(old_lp, ref_lp, values, teacher, entropy and _response(entropy, lengths)), routing

    def _teacher_log_probs(self, share: RankShare) -> list[torch.Tensor]:
        """--use-opd: this rank's samples' teacher log-probs (--opd-type megatron: the teacher's forward here; sglang:
        from the samples), or an error saying which samples have none."""
        if self.teacher_weights is not None:
            data = share.data
            self._before_log_prob("teacher_")
            return _response(self._forward_with_weights(self.teacher_weights, data), data.response_lengths)
        hint = (
            "with --opd-type sglang, use --custom-rm-path slime.rollout.on_policy_distillation.reward_func with the "
            "teacher's /generate URL as --rm-url"
        )
        teacher = every_sample(share, self.step.collectives, "teacher_log_probs", "--use-opd", hint)
        return [torch.tensor(t, dtype=torch.float32) for t in teacher]

    def _rollout_routing(self, share: RankShare) -> list[Any]:
        """R3: this rank's samples' routed experts from SGLang, or an error saying which samples have none."""
        hint = (
            "a generate function must send return_routed_experts=True and keep the answer's "
            "meta_info['routed_experts'] (Sample.append_response_tokens does)"
        )
        return every_sample(
            share, self.step.collectives, "rollout_routed_experts", "--use-rollout-routing-replay", hint
        )

    def update_weights(
        self,
        server_urls: list[str],
        version: int,
        transport: str,
        output_dir: str,
        fleet: Any = None,
        behind: list[str] | None = None,
    ) -> float:
        """Push the current weights to every server as `version` (rank 0 sends; all ranks take part in the
        gather), retrying and falling back as the weight-update flags say; optionally check the result. With
        `fleet` (the rollout manager, --use-fault-tolerance) an engine that dies meanwhile is its to take out;
        `behind`: the servers restarted since they got weights (a multi-LoRA update sends them every adapter)."""
        from slime_like.trainer.weights.factory import make_updater
        from slime_like.trainer.weights.updater import ask_fleet

        start = time.monotonic()
        # An engine was restarted, the last update lost one (its updater targets only those left), or the caller
        # names another transport.
        made_for = (list(server_urls), transport)
        stale = made_for != (self.transport_urls, self.transport_kind)
        if self.transport is not None and (stale or self.transport.urls is not None):
            self.transport.close()
            self.transport = None
        if self.transport is None:
            multi_lora = self.lora_slots is not None
            self.transport = make_updater(
                self.args, server_urls, transport, output_dir, self.engine.lora, multi_lora, self.master_addr, self.rank
            )
            self.transport_urls, self.transport_kind = made_for
        self.transport.fleet = ask_fleet(fleet, self.args.rollout_health_check_timeout) if fleet else None
        # --fully-async pauses with its mode (requests stay in flight); every other loop drains (abort).
        mode = self.args.pause_generation_mode if self.args.fully_async else "abort"
        # A LoRA run sends its adapter only: the servers keep the base they started with (weights/lora.py).
        export = self.engine.export_adapter if self.engine.lora is not None else self.engine.export_hf_weights
        if self.lora_slots is not None:  # multi-LoRA: the adapters that changed since the servers got them
            # A restarted server holds none (it started with the base only): then every adapter goes, to all.
            restarted = bool(set(behind or ()) & set(server_urls))
            names = self.lora_slots.names if restarted else self.lora_slots.changed
            export = partial(self.lora_slots.export, sorted(names))
        # An in-place transport leaves out the frozen weights every engine holds already (megatron/frozen_weights.py).
        in_place = None if self.engine.lora is not None else partial(self.engine.export_hf_weights, in_place=True)
        used = self.transport.update(export, version, mode, in_place)
        if self.old_actor is not None:  # --keep-old-actor: slime's queue moves on with each update
            self.old_actor.rotate()
        if self.lora_slots is not None:
            self.lora_slots.changed.clear()
        if self.args.check_weight_update:  # the engines the update reached: the fleet took out any that died
            live = self.transport.urls if self.transport.urls is not None else server_urls
            gone: list[str] = []  # died since the update: the fleet took them out
            worst = self.check_weights(live, f"after the update to version {version}", self.transport.fleet, gone)
            logger.info("weight version %d over %s: servers match the trainer within %.2g (%d servers)", version, used,
                        worst, len(live) - len(set(gone)))  # fmt: skip
        return time.monotonic() - start

    def check_weights(self, server_urls: list[str], when: str, fleet: Any = None, skipped: list | None = None) -> float:
        """Compare a probe's log-probs on every server with this trainer's (--check-weight-update); the largest
        difference, or WeightUpdateError naming the server, the difference and both precisions (`fleet`: the
        updater's verdict, which skips a server that died since)."""
        from slime_like.trainer.weights.check import check_servers

        tolerance = self.args.check_weight_update_tolerance or (0.1 if self.args.bf16 else 1e-3)
        check = partial(check_servers, self.engine, server_urls, tolerance, self.rank, fleet=fleet, skipped=skipped)
        if self.lora_slots is None:
            return check(when)
        worst = 0.0
        for name in self.lora_slots.names:  # multi-LoRA: each adapter against the servers' adapter of that name
            self.lora_slots.activate(name)
            worst = max(worst, check(f"{when} ({name})", name))
        return worst

    def shutdown(self) -> None:
        """Close the weight channel (servers leave its group), free the model and leave torch.distributed, before
        the process exits and tears them down in an order that aborts."""
        import torch.distributed as dist

        if self.transport is not None:
            self.transport.close()
            self.transport = None
        # The tensor transport moved the weights' storage to shared memory ("file_system" strategy): free it
        # now, while torch's shared-memory manager still runs (at exit its socket is gone: "Broken pipe").
        self.engine = self.critic = None
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()

    def pid(self) -> int:
        """This rank's process id (placement.json records it; an idle rank answers it as a liveness ping)."""
        return os.getpid()

    def touch(self, path: str) -> None:
        """Create an empty file at `path` on this rank's node (the disk transport's shared-filesystem check)."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).touch()

    def offload(self) -> dict[str, float]:
        """Colocated on GPU: move weights, gradient buffers and optimizer states off the GPU (servers generate)."""
        return self.memory.offload()

    def onload(self) -> dict[str, float]:
        """Bring them back before log-probs and training; returns the memory accounting (empty when off)."""
        return self.memory.onload()

    def save(self, directory: str, iteration: int = 0) -> None:
        """Megatron torch_dist checkpoint of model, optimizer and RNG into directory (the critic's in critic/)."""
        from slime_like.trainer.megatron.checkpoint_layout import CRITIC_DIR

        if self.lora_slots is not None:  # multi-LoRA: the first adapter is the one of the model's own checkpoint
            self.lora_slots.activate(self.lora_slots.names[0])
        self.engine.save_checkpoint(directory, iteration, not getattr(self.args, "no_save_optim", False))
        if self.lora_slots is not None:  # multi-LoRA: every adapter, in PEFT format and to resume (lora_slots.py)
            self.lora_slots.save(directory)
        if self.critic is not None:
            self.critic.save_checkpoint(Path(directory) / CRITIC_DIR, iteration, not self.args.no_save_optim)

    def save_hf(self, directory: str) -> None:
        """--save-hf: the policy's weights as an HF checkpoint in `directory` (a collective; rank 0 writes)."""
        from slime_like.trainer.weights.disk import write_checkpoint

        named = self.engine.export_hf_weights()
        if self.rank == 0:
            write_checkpoint(named, Path(directory), Path(self.args.hf_checkpoint), self.args.update_weight_buffer_size)
        else:
            for _ in named:  # every rank takes part in the gathers
                pass

    def load(self, directory: str, load_optimizer: bool = True, load_rng: bool = True) -> None:
        """Load a torch_dist checkpoint: ours (the critic's from its critic/), or one of Megatron-LM or slime."""
        from slime_like.trainer.megatron.checkpoint_layout import CRITIC_DIR

        self.engine.load_checkpoint(directory, load_optimizer, load_rng)
        if self.old_actor is not None:  # as slime, the kept copies start as the loaded weights
            self.old_actor.reset()
        if self.lora_slots is not None:  # multi-LoRA: every adapter with its own optimizer state (lora_slots.py)
            self.lora_slots.load(directory, load_optimizer)
        if self.critic is None:
            return
        critic = Path(directory) / CRITIC_DIR
        if critic.is_dir():
            self.critic.load_checkpoint(critic, load_optimizer, load_rng=False)  # one RNG state: the policy's
        else:
            logger.info("%s holds no critic (%s/): the critic starts from --hf-checkpoint", directory, CRITIC_DIR)
