"""One trainer rank: the Megatron policy (and, for PPO, critic) engines and the RL step of slime_like/algorithms.

A rollout's step: recompute the old policy's log-probs (and the reference's, and the critic's values)
on the whole rollout, compute advantages (advantages.py), off-policy weights (off_policy.py) and
mismatch metrics, then take one optimizer step per --global-batch-size chunk with the loss function
of --loss-type (loss.py), its token weights set by --loss-agg-mode on the chunk (aggregation.py).
Every rank holds the whole rollout, so all of this is global without communication; the engine
splits each step over data-parallel ranks.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

from buffer.train_data import TrainData
from slime_like.algorithms.advantages import AdvantageInputs, compute_advantages
from slime_like.algorithms.aggregation import token_weights
from slime_like.algorithms.dapo import overlong_penalty
from slime_like.algorithms.loss import custom_loss_fn, policy_loss_fn, sft_loss_fn, value_loss_fn
from slime_like.algorithms.off_policy import decoupled_weights, mis_weights, mismatch_sums, tis_weights
from slime_like.algorithms.slime_contract import slime_advantages, slime_loss_fn
from slime_like.core.logs import setup_logging
from slime_like.core.plugin_loader import load_hook

# (positional parameters, async?) of the loss and advantage hooks under (our contract, slime's): docs/plugins.md
LOSS_SIG = ((4, False), (4, False))
ADV_SIG = ((2, False), (2, False))

logger = logging.getLogger(__name__)


def _response(full: list[torch.Tensor], lengths: list[int]) -> list[torch.Tensor]:
    """The response part (last n entries) of per-sequence engine outputs."""
    return [x[-n:] for x, n in zip(full, lengths, strict=True)]


class TrainActor:
    """A trainer rank; every rank gets the full rollout and the engine takes its DP share."""

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
        from slime_like.megatron.engine import MegatronTrainEngine
        from slime_like.megatron.offload import TrainerOffload, materialize_optimizer_state
        from slime_like.megatron.parallel import init_parallel

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
        )
        from slime_like.megatron.cpu_compat import transformer_engine_available
        from slime_like.megatron.flags import model_config_overrides

        common = {
            "max_tokens_per_micro_batch": args.max_tokens_per_gpu,
            "dtype": torch.bfloat16 if args.bf16 else torch.float32,
            # recompute, dropout and kernel flags (slime_like/megatron/flags.py) -> TransformerConfig
            **model_config_overrides(args, transformer_engine_available(), torch.cuda.is_available()),
        }
        # Colocated on GPU, what is built in this region leaves the GPU while the servers generate.
        self.memory = TrainerOffload(args.offload_train, rebuild_groups=True)
        # MoE routing replay (slime_like/megatron/routing_replay.py): the policy's routers can take given experts.
        replay = {"moe_enable_routing_replay": True} if getattr(args, "use_routing_replay", False) else {}
        with self.memory.region():
            self.engine = MegatronTrainEngine(
                args.hf_checkpoint,
                self._optimizer_settings(args.lr),
                temperature=args.rollout_temperature,
                **common,
                **replay,
            )
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
            if self.memory.enabled:  # Adam's moments would otherwise appear at the first step, outside the region
                for engine in (self.engine, self.critic):
                    if engine is not None:
                        materialize_optimizer_state(engine.optimizer)
        api, self.slime_loss = getattr(args, "plugin_api", "auto"), False
        if args.loss_type == "sft_loss":
            self.loss_fn = sft_loss_fn()
        elif args.loss_type == "custom_loss":
            # Ours or slime's contract (slime_like/core/plugin_loader.py); slime's is adapted here, at the call.
            hook, contract = load_hook(args.custom_loss_function_path, "--custom-loss-function-path", api, *LOSS_SIG)
            self.slime_loss = contract == "slime"
            self.loss_fn = slime_loss_fn(args, hook) if self.slime_loss else custom_loss_fn(args, hook)
        else:
            self.loss_fn = policy_loss_fn(args)
        # Entropy is only a metric unless the loss uses it: then it needs no [tokens, vocab] backward.
        self.entropy_grad = args.loss_type == "custom_loss" or bool(args.entropy_coef)
        path = args.custom_advantage_function_path
        self.custom_advantage, self.slime_advantage = None, False
        if path:
            self.custom_advantage, contract = load_hook(path, "--custom-advantage-function-path", api, *ADV_SIG)
            self.slime_advantage = contract == "slime"
        self.transport = None
        self.transport_urls: list[str] = []  # the servers the transport was made for

    def _optimizer_settings(self, lr: float):
        from slime_like.megatron.cpu_compat import transformer_engine_available
        from slime_like.megatron.flags import optimizer_settings

        cuda = torch.cuda.is_available()
        return optimizer_settings(self.args, lr, self.steps_per_rollout, cuda, transformer_engine_available())

    @property
    def steps_per_rollout(self) -> int:
        """Optimizer steps per rollout (samples per rollout / --global-batch-size)."""
        return self.args.rollout_batch_size * self.args.n_samples_per_prompt // self.args.global_batch_size

    def _reference_weights(self) -> dict[str, torch.Tensor]:
        """The KL reference: the weights of the --ref-load checkpoint, else the starting (--hf-checkpoint) ones."""
        start = self._snapshot()
        if not self.args.ref_load:
            return start
        from slime_like.megatron.checkpoint_layout import require_checkpoint

        checkpoint = require_checkpoint(self.args.ref_load, "--ref-load")
        self.engine.load_model_weights(checkpoint.directory)
        reference = self._snapshot()
        self._load_weights(start)  # the policy starts where --hf-checkpoint (or a later --load) puts it
        logger.info("KL reference weights: --ref-load %s", checkpoint.directory)
        return reference

    def _snapshot(self) -> dict[str, torch.Tensor]:
        return {
            k: v.detach().clone() for m in self.engine.model for k, v in m.state_dict().items() if torch.is_tensor(v)
        }

    def _forward_with_weights(self, weights: dict[str, torch.Tensor], tokens: list[list[int]]) -> list[torch.Tensor]:
        """Log-probs under other weights (the reference), then put the current ones back."""
        current = self._snapshot()
        self._load_weights(weights)
        try:
            return self.engine.forward_logprobs(tokens)
        finally:
            self._load_weights(current)

    def _load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for m in self.engine.model:
                for k, v in m.state_dict().items():
                    if k in weights and torch.is_tensor(v):
                        v.copy_(weights[k])

    def train(self, rollout_id: int, data: TrainData) -> dict[str, float]:
        """Prepare the rollout (log-probs, values, advantages), then take this rollout's optimizer steps."""
        start = time.monotonic()
        if len(data) == 0:  # every sample failed or was filtered out: nothing to learn from
            logger.warning("rollout %d: no usable samples, no optimizer step", rollout_id)
            return {}
        sft = self.args.loss_type == "sft_loss"
        rows, metrics, routing = (*self._sft_rows(data), None) if sft else self._rl_rows(data)
        prepare_time = time.monotonic() - start
        # Critic warm-up: the first --num-critic-only-steps rollouts leave the policy as it is.
        train_policy = rollout_id >= self.args.num_critic_only_steps
        per_step = self.args.global_batch_size
        step_metrics: list[dict[str, float]] = []
        for begin in range(0, len(data), per_step):
            idx = list(range(begin, min(begin + per_step, len(data))))
            tokens, step_rows = [data.tokens[i] for i in idx], self._weighted([rows[i] for i in idx])
            step: dict[str, float] = {}
            if self.critic is not None:
                out = self.critic.train_step(tokens, step_rows, value_loss_fn(self.args))
                step.update({f"critic/{k}": v for k, v in out.items()})
            if train_policy:
                out = self.engine.train_step(
                    tokens,
                    step_rows,
                    self.loss_fn,
                    with_entropy=not sft,
                    entropy_grad=self.entropy_grad,
                    routing=None if routing is None else [routing[i] for i in idx],
                )
                step.update({f"train/{k}": v for k, v in out.items()})
            step_metrics.append(step)
        for key in step_metrics[0] if step_metrics else ():
            total = sum(m[key] for m in step_metrics)
            metrics[key] = total if key.endswith("skipped_steps") else total / len(step_metrics)  # a count
        metrics["time/logprob"] = prepare_time
        metrics["time/train"] = time.monotonic() - start - prepare_time
        return metrics

    def _weighted(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Rows of one step with their aggregation weights (--loss-agg-mode) and token-mean metric weights."""
        masks = [r["loss_mask"] for r in rows]
        weights = token_weights(masks, self.args.loss_agg_mode, self.args.rollout_max_response_len)
        metric = token_weights(masks, "token-mean")
        return [{**r, "token_weight": w, "metric_weight": m} for r, w, m in zip(rows, weights, metric, strict=True)]

    def _sft_rows(self, data: TrainData) -> tuple[list[dict[str, Any]], dict[str, float]]:
        rows = [
            {"response_length": n, "loss_mask": torch.tensor(m, dtype=torch.float32)}
            for n, m in zip(data.response_lengths, data.loss_masks, strict=True)
        ]
        return rows, {}

    def _rl_rows(self, data: TrainData) -> tuple[list[dict[str, Any]], dict[str, float], list[Any] | None]:
        """Old/ref log-probs, values, advantages and off-policy weights of every sample, and the routing the
        training forwards replay (None: no routing replay)."""
        args, lengths = self.args, data.response_lengths
        masks = [torch.tensor(m, dtype=torch.float32) for m in data.loss_masks]
        # Routing replay, as slime: R3 replays the rollout's experts in the old-policy and training forwards;
        # --use-routing-replay records the old-policy forward's and replays them in training. Ref and critic route.
        routing = self._rollout_routing(data) if getattr(args, "use_rollout_routing_replay", False) else None
        if getattr(args, "use_routing_replay", False) and routing is None:
            old_full, routing = self.engine.forward_logprobs_and_routing(data.tokens)
        else:
            old_full = self.engine.forward_logprobs(data.tokens, routing=routing)
        old_lp = _response(old_full, lengths)
        ref_lp = None
        if self.ref_weights is not None:
            ref_lp = _response(self._forward_with_weights(self.ref_weights, data.tokens), lengths)
        values = _response(self.critic.forward_values(data.tokens), lengths) if self.critic is not None else None
        rollout_lp = [None if r is None else torch.tensor(r, dtype=torch.float32) for r in data.rollout_log_probs]
        rewards = list(data.raw_rewards)
        metrics: dict[str, float] = {}
        if args.overlong_buffer_len:
            penalties = [
                overlong_penalty(
                    n, args.rollout_max_response_len, args.overlong_buffer_len, args.overlong_penalty_factor
                )
                for n in lengths
            ]
            rewards = [r + p for r, p in zip(rewards, penalties, strict=True)]
            metrics["train/overlong_penalty_mean"] = sum(penalties) / max(1, len(penalties))
        normalized = bool(data.reward_normalized) and all(data.reward_normalized)  # by a slime post-process
        inputs = AdvantageInputs(rewards, data.group_ids, masks, old_lp, ref_lp, rollout_lp, values, normalized)
        if args.use_opd:
            inputs.teacher_log_probs = self._teacher_log_probs(data)
        custom = self.custom_advantage
        if custom is not None and self.slime_advantage:
            custom = partial(slime_advantages, fn=self.custom_advantage, tokens=data.tokens)
        result = compute_advantages(args, inputs, custom)
        if values is not None and result.returns is None:
            raise ValueError("--custom-advantage-function-path with ppo must return Advantages(advantages, returns)")
        is_weights = self._is_weights(old_lp, rollout_lp, masks)
        old = self._require_rollout(rollout_lp, "--use-rollout-logprobs") if args.use_rollout_logprobs else old_lp
        if args.custom_tis_function_path:
            self._require_rollout(rollout_lp, "--custom-tis-function-path")
        rows = []
        for i, mask in enumerate(masks):
            row = {
                "response_length": lengths[i],
                "loss_mask": mask,
                "old_log_probs": old[i],
                "advantages": result.advantages[i],
            }
            if ref_lp is not None:
                row["ref_log_probs"] = ref_lp[i]
            if is_weights is not None:
                row["is_weight"] = is_weights[i]
            if values is not None:
                row["old_values"], row["returns"] = values[i], result.returns[i]
            if self.slime_loss:  # slime's loss batch carries the tokens and SGLang's log-probs too
                row["tokens"] = torch.tensor(data.tokens[i])
                if rollout_lp[i] is not None:
                    row["rollout_log_probs"] = rollout_lp[i]
            if args.custom_tis_function_path or args.custom_pg_loss_reducer_function_path:  # slime's hooks read them
                row["total_length"] = len(data.tokens[i])
                if args.custom_tis_function_path:
                    row["rollout_log_probs"] = rollout_lp[i]  # checked above
            rows.append(row)
        metrics.update(self._rollout_metrics(result.advantages, masks, old_lp, rollout_lp, is_weights))
        if result.opd_reverse_kl is not None:  # slime's opd_reverse_kl: mean over the loss tokens
            tokens = max(1.0, sum(float(m.sum()) for m in masks))
            metrics["train/opd_reverse_kl"] = sum(float(k.sum()) for k in result.opd_reverse_kl) / tokens
        return rows, metrics, routing

    def _teacher_log_probs(self, data: TrainData) -> list[torch.Tensor]:
        """--use-opd: every sample's teacher log-probs, or an error saying which samples have none."""
        hint = (
            "with --opd-type sglang, use --custom-rm-path slime.rollout.on_policy_distillation.reward_func with the "
            "teacher's /generate URL as --rm-url"
        )
        teacher = _every_sample(data, "teacher_log_probs", "--use-opd", hint)
        return [torch.tensor(t, dtype=torch.float32) for t in teacher]

    def _rollout_routing(self, data: TrainData) -> list[Any]:
        """R3: every sample's routed experts from SGLang, or an error saying which samples have none."""
        hint = (
            "a generate function must send return_routed_experts=True and keep the answer's "
            "meta_info['routed_experts'] (Sample.append_response_tokens does)"
        )
        return _every_sample(data, "rollout_routed_experts", "--use-rollout-routing-replay", hint)

    def _require_rollout(self, rollout_lp: list[torch.Tensor | None], flag: str) -> list[torch.Tensor]:
        missing = [i for i, r in enumerate(rollout_lp) if r is None]
        if missing:
            raise ValueError(f"{flag} needs SGLang's log-probs, but {len(missing)} samples have none")
        return rollout_lp  # type: ignore[return-value]

    def _is_weights(
        self, old_lp: list[torch.Tensor], rollout_lp: list[torch.Tensor | None], masks: list[torch.Tensor]
    ) -> list[torch.Tensor] | None:
        """Per-token off-policy weights pi_old / pi_rollout of the chosen correction (None: no correction)."""
        args = self.args
        if args.use_tis and not args.custom_tis_function_path:  # slime's TIS hook weighs inside the loss
            flag, weigh = "--use-tis", lambda d, m: tis_weights(d, args.tis_clip_low, args.tis_clip)
        elif args.use_mis:
            flag, weigh = "--use-mis", lambda d, m: mis_weights(d, m, args.mis_level, args.mis_low, args.mis_high)
        elif args.use_decoupled_loss:
            flag, weigh = "--use-decoupled-loss", lambda d, m: decoupled_weights(d, args.behav_imp_weight_cap)
        else:
            return None
        behaviour = self._require_rollout(rollout_lp, flag)
        return [weigh(o - b, m) for o, b, m in zip(old_lp, behaviour, masks, strict=True)]

    def _rollout_metrics(
        self,
        advantages: list[torch.Tensor],
        masks: list[torch.Tensor],
        old_lp: list[torch.Tensor],
        rollout_lp: list[torch.Tensor | None],
        is_weights: list[torch.Tensor] | None,
    ) -> dict[str, float]:
        """Advantage statistics, train/rollout mismatch (where SGLang gave log-probs) and IS weight use."""
        tokens = max(1.0, sum(float(m.sum()) for m in masks))
        mean = sum(float((a * m).sum()) for a, m in zip(advantages, masks, strict=True)) / tokens
        var = sum(float((((a - mean) ** 2) * m).sum()) for a, m in zip(advantages, masks, strict=True)) / tokens
        metrics = {"train/advantage_mean": mean, "train/advantage_std": var**0.5}
        have = [i for i, r in enumerate(rollout_lp) if r is not None]
        if have:
            sums: dict[str, float] = {}
            for i in have:
                part = mismatch_sums(old_lp[i], rollout_lp[i], masks[i], self.args.mis_low, self.args.mis_high)
                for key, value in part.items():
                    sums[key] = sums.get(key, 0.0) + value
            n = max(1.0, sum(float(masks[i].sum()) for i in have))
            metrics["train/train_rollout_logprob_abs_diff"] = sums["abs_diff"] / n
            metrics["train/train_rollout_kl"] = sums["kl"] / n
            metrics["train/train_rollout_out_of_band_frac"] = sums["out_of_band"] / n
        if is_weights is not None:
            metrics["train/is_weight_mean"] = (
                sum(float((w * m).sum()) for w, m in zip(is_weights, masks, strict=True)) / tokens
            )
            metrics["train/is_dropped_frac"] = (
                sum(float(((w == 0).float() * m).sum()) for w, m in zip(is_weights, masks, strict=True)) / tokens
            )
        return metrics

    def update_weights(self, server_urls: list[str], version: int, transport: str, output_dir: str) -> float:
        """Push the current weights to every server as `version` (rank 0 sends; all ranks take part in the
        gather), retrying and falling back as the weight-update flags say; optionally check the result."""
        start = time.monotonic()
        if self.transport is not None and server_urls != self.transport_urls:  # an engine was restarted
            self.transport.close()
            self.transport = None
        if self.transport is None:
            self.transport = self._make_transport(server_urls, transport, output_dir)
            self.transport_urls = list(server_urls)
        # --fully-async pauses with its mode (requests stay in flight); every other loop drains (abort).
        mode = self.args.pause_generation_mode if self.args.fully_async else "abort"
        used = self.transport.update(self.engine.export_hf_weights, version, mode)
        if self.args.check_weight_update:
            worst = self.check_weights(server_urls, f"after the update to version {version}")
            logger.info("weight version %d over %s: servers match the trainer within %.2g", version, used, worst)
        return time.monotonic() - start

    def check_weights(self, server_urls: list[str], when: str) -> float:
        """Compare a probe's log-probs on every server with this trainer's (--check-weight-update); the largest
        difference, or WeightUpdateError naming the server, the difference and both precisions."""
        from slime_like.weights.check import check_servers

        tolerance = self.args.check_weight_update_tolerance or (0.1 if self.args.bf16 else 1e-3)
        return check_servers(self.engine, server_urls, tolerance, self.rank, when)

    def _make_transport(self, server_urls: list[str], kind: str, output_dir: str):
        """A WeightUpdater with `kind` as the transport and the --update-weight-fallback one behind it."""
        from slime_like.weights.disk import DiskTransport
        from slime_like.weights.distributed import DistributedTransport
        from slime_like.weights.tensor import TensorTransport
        from slime_like.weights.updater import WeightUpdater

        args = self.args
        size, timeout, tp = args.update_weight_buffer_size, args.update_weight_timeout, args.rollout_num_gpus_per_engine
        factories = {
            # Rank 0's node address (MASTER_ADDR): engines on other nodes join the weight group there.
            "distributed": lambda: DistributedTransport(
                server_urls, size, tp_per_server=tp, master_address=self.master_addr, timeout_s=timeout
            ),
            "tensor": lambda: TensorTransport(server_urls, size, tp_per_server=tp, timeout_s=timeout),
            "disk": lambda: DiskTransport(
                server_urls, size, args.hf_checkpoint, os.path.join(output_dir, "weights"), timeout_s=timeout
            ),
        }
        fallback = None if args.update_weight_fallback == "none" else args.update_weight_fallback
        return WeightUpdater(factories, kind, fallback, args.update_weight_retries, self.rank)

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
        from slime_like.megatron.checkpoint_layout import CRITIC_DIR

        self.engine.save_checkpoint(directory, iteration)
        if self.critic is not None:
            self.critic.save_checkpoint(Path(directory) / CRITIC_DIR, iteration)

    def load(self, directory: str, load_optimizer: bool = True, load_rng: bool = True) -> None:
        """Load a torch_dist checkpoint: ours (the critic's from its critic/), or one of Megatron-LM or slime."""
        from slime_like.megatron.checkpoint_layout import CRITIC_DIR

        self.engine.load_checkpoint(directory, load_optimizer, load_rng)
        if self.critic is None:
            return
        critic = Path(directory) / CRITIC_DIR
        if critic.is_dir():
            self.critic.load_checkpoint(critic, load_optimizer, load_rng=False)  # one RNG state: the policy's
        else:
            logger.info("%s holds no critic (%s/): the critic starts from --hf-checkpoint", directory, CRITIC_DIR)


def _every_sample(data: TrainData, column: str, flag: str, hint: str) -> list[Any]:
    """A per-sample column `flag` needs, or an error naming the samples that lack it and how to fill it."""
    values = getattr(data, column) or [None] * len(data)
    missing = [data.sample_indices[i] for i, v in enumerate(values) if v is None]
    if missing:
        raise ValueError(
            f"{flag}: {len(missing)} of {len(data)} samples have no {column} (sample indices {missing[:8]}): {hint}"
        )
    return values
