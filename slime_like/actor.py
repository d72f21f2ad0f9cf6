"""One trainer rank: the Megatron policy (and, for PPO, critic) engines and the RL step of slime_like/algorithms.

A rollout's step: recompute the old policy's log-probs (and the reference's, and the critic's values)
on this rank's share of the rollout, compute advantages (advantages.py), off-policy weights (off_policy.py) and
mismatch metrics, then take one optimizer step per --global-batch-size chunk with the loss function
of --loss-type (loss.py), its token weights set by --loss-agg-mode on the chunk (aggregation.py).

A rank holds only its data-parallel share (buffer.train_data.RankShare: the rollout manager split the rollout,
each step token-balanced over the ranks) and the rollout-wide scalars. Group baselines come from those scalars;
whatever sums over the whole rollout or step (whitening, the aggregation's counts, metrics) gathers one number
per sample over the DP ranks into rollout order, so every rank adds the same numbers in the same order as a
single process would. Log-probs never leave their rank.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from dataclasses import fields
from functools import partial
from pathlib import Path
from typing import Any

import torch

from buffer.train_data import RankShare, TrainData, split_by_dp
from slime_like.algorithms.advantages import AdvantageInputs, Advantages, RolloutScope, compute_advantages
from slime_like.algorithms.aggregation import token_weights
from slime_like.algorithms.dapo import overlong_penalty
from slime_like.algorithms.loss import custom_loss_fn, policy_loss_fn, sft_loss_fn, value_loss_fn
from slime_like.algorithms.off_policy import decoupled_weights, mis_weights, mismatch_sums, tis_weights
from slime_like.algorithms.slime_contract import slime_advantages, slime_loss_fn
from slime_like.core.logs import setup_logging
from slime_like.core.plugin_loader import load_hook
from slime_like.trainer_hooks import load_trainer_hooks

# (positional parameters, async?) of the loss and advantage hooks under (our contract, slime's): docs/plugins.md
LOSS_SIG = ((4, False), (4, False))
ADV_SIG = ((2, False), (2, False))

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
        self.hooks = load_trainer_hooks(args)
        if self.hooks.init is not None:
            self.hooks.init(args)  # slime: after the parallel groups, before the model
        from slime_like.megatron.cpu_compat import transformer_engine_available
        from slime_like.megatron.flags import model_config_overrides, mtp_engine_args
        from slime_like.megatron.lora import lora_settings

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
                **mtp_engine_args(args),  # --enable-mtp-training: the MTP layers are built and trained
                lora=lora_settings(args),  # --lora-rank: adapters trained on a frozen base (megatron/lora.py)
            )
            if getattr(args, "lora_adapter_path", None):
                self.engine.load_adapter(args.lora_adapter_path)
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
                self.teacher_weights = self._checkpoint_weights(args.opd_teacher_load, "--opd-teacher-load")
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
        if not self.args.ref_load:
            return self._snapshot()
        return self._checkpoint_weights(self.args.ref_load, "--ref-load")

    def _before_log_prob(self, store_prefix: str) -> None:
        """--custom-megatron-before-log-prob-hook-path, with slime's store prefix of the forward that follows."""
        if self.hooks.before_log_prob is not None:
            self.hooks.before_log_prob(self.args, self.engine.model, store_prefix)

    def _checkpoint_weights(self, path: str, flag: str) -> dict[str, torch.Tensor]:
        """The model weights of the Megatron checkpoint at `path` (named by `flag`), read through the policy's
        model, whose own weights are put back."""
        from slime_like.megatron.checkpoint_layout import require_checkpoint

        start = self._snapshot()
        checkpoint = require_checkpoint(path, flag)
        self.engine.load_model_weights(checkpoint.directory)
        weights = self._snapshot()
        self._load_weights(start)  # the policy starts where --hf-checkpoint (or a later --load) puts it
        logger.info("%s weights: %s", flag, checkpoint.directory)
        return weights

    def _snapshot(self) -> dict[str, torch.Tensor]:
        return {
            k: v.detach().clone() for m in self.engine.model for k, v in m.state_dict().items() if torch.is_tensor(v)
        }

    def _forward_with_weights(self, weights: dict[str, torch.Tensor], tokens: list[list[int]]) -> list[torch.Tensor]:
        """Log-probs of this rank's share under other weights (the reference), then put the current ones back."""
        current = self._snapshot()
        self._load_weights(weights)
        try:
            return self.engine.forward_logprobs(tokens, local=True)
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
        start = time.monotonic()
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
        sft = self.args.loss_type == "sft_loss"
        rows, metrics, routing = (*self._sft_rows(share), None) if sft else self._rl_rows(share)
        self.hooks.postprocess(self.args, rollout_id, share.data.tokens, rows)
        # Loss tokens of every sample of the rollout: each step's aggregation counts its sequences and tokens.
        counts = self._gather_rows(share, [float(r["loss_mask"].sum()) for r in rows])
        prepare_time = time.monotonic() - start
        # Critic warm-up: the first --num-critic-only-steps rollouts leave the policy as it is.
        train_policy = rollout_id >= self.args.num_critic_only_steps
        step_metrics: list[dict[str, float]] = []
        for step_id, ((begin, end), idx) in enumerate(zip(share.step_bounds, share.steps, strict=True)):
            step_counts = counts[begin:end]
            totals = (sum(c > 0 for c in step_counts), sum(step_counts))
            tokens, step_rows = [share.data.tokens[i] for i in idx], self._weighted([rows[i] for i in idx], totals)
            step: dict[str, float] = {}
            if self.critic is not None:
                out = self.critic.train_step(tokens, step_rows, value_loss_fn(self.args), local=True)
                step.update({f"critic/{k}": v for k, v in out.items()})
            if train_policy:
                if self.hooks.before_train_step is not None:
                    engine = self.engine
                    hook = self.hooks.before_train_step
                    hook(self.args, rollout_id, step_id, engine.model, engine.optimizer, engine.scheduler)
                out = self.engine.train_step(
                    tokens,
                    step_rows,
                    self.loss_fn,
                    with_entropy=not sft,
                    entropy_grad=self.entropy_grad,
                    routing=None if routing is None else [routing[i] for i in idx],
                    local=True,
                    mtp_loss_masks=None if self.engine.mtp is None else self.engine.mtp.loss_masks(tokens, step_rows),
                )
                step.update({f"train/{k}": v for k, v in out.items()})
            step_metrics.append(step)
        for key in step_metrics[0] if step_metrics else ():
            total = sum(m[key] for m in step_metrics)
            metrics[key] = total if key.endswith("skipped_steps") else total / len(step_metrics)  # a count
        metrics["time/logprob"] = prepare_time
        metrics["time/train"] = time.monotonic() - start - prepare_time
        return metrics

    def _own_share(self, data: TrainData) -> RankShare:
        """This rank's share of a whole rollout, split as the rollout manager splits it."""
        dp_rank, dp_size, multiple = self.data_parallel()
        return split_by_dp(data, dp_size, self.args.global_batch_size, multiple)[dp_rank]

    def _gather_rows(self, share: RankShare, values: list[float]) -> list[float]:
        """One number per sample of this rank's share -> one per sample of the rollout, in rollout order.

        One all-reduce over the DP group of a vector that each rank fills at its own rows only: every entry is
        one rank's number plus zeros, so the result is exact, and sums over it add in a single process's order."""
        full = torch.zeros(len(share.rollout), dtype=torch.float64, device=self.engine.device)
        if share.rows:
            full[share.rows] = torch.tensor(values, dtype=torch.float64, device=self.engine.device)
        if share.dp_size > 1:
            from megatron.core import parallel_state as mpu

            torch.distributed.all_reduce(full, group=mpu.get_data_parallel_group())
        return full.tolist()

    def _weighted(self, rows: list[dict[str, Any]], totals: tuple[int, float]) -> list[dict[str, Any]]:
        """Rows of this rank's part of one step with their aggregation weights (--loss-agg-mode) and token-mean
        metric weights; `totals` are the whole step's sequences with a loss token and loss tokens."""
        masks = [r["loss_mask"] for r in rows]
        weights = token_weights(masks, self.args.loss_agg_mode, self.args.rollout_max_response_len, totals)
        metric = token_weights(masks, "token-mean", totals=totals)
        return [{**r, "token_weight": w, "metric_weight": m} for r, w, m in zip(rows, weights, metric, strict=True)]

    def _sft_rows(self, share: RankShare) -> tuple[list[dict[str, Any]], dict[str, float]]:
        data = share.data
        rows = [
            {"response_length": n, "loss_mask": torch.tensor(m, dtype=torch.float32)}
            for n, m in zip(data.response_lengths, data.loss_masks, strict=True)
        ]
        return rows, {}

    def _rl_rows(self, share: RankShare) -> tuple[list[dict[str, Any]], dict[str, float], list[Any] | None]:
        """Old/ref log-probs, values, advantages and off-policy weights of this rank's samples, and the routing
        the training forwards replay (None: no routing replay)."""
        args, data, whole = self.args, share.data, share.rollout
        lengths = data.response_lengths
        masks = [torch.tensor(m, dtype=torch.float32) for m in data.loss_masks]
        # Routing replay, as slime: R3 replays the rollout's experts in the old-policy and training forwards;
        # --use-routing-replay records the old-policy forward's and replays them in training. Ref and critic route.
        routing = self._rollout_routing(share) if getattr(args, "use_rollout_routing_replay", False) else None
        self._before_log_prob("")
        if getattr(args, "use_routing_replay", False) and routing is None:
            old_full, routing = self.engine.forward_logprobs_and_routing(data.tokens, local=True)
        else:
            old_full = self.engine.forward_logprobs(data.tokens, routing=routing, local=True)
        old_lp = _response(old_full, lengths)
        ref_lp = None
        if self.ref_weights is not None:
            self._before_log_prob("ref_")
            ref_lp = _response(self._forward_with_weights(self.ref_weights, data.tokens), lengths)
        values = None
        if self.critic is not None:
            values = _response(self.critic.forward_values(data.tokens, local=True), lengths)
        rollout_lp = [None if r is None else torch.tensor(r, dtype=torch.float32) for r in data.rollout_log_probs]
        rewards, every_reward = list(data.raw_rewards), list(whole.raw_rewards)
        metrics: dict[str, float] = {}
        if args.overlong_buffer_len:

            def penalty(n: int) -> float:
                return overlong_penalty(
                    n, args.rollout_max_response_len, args.overlong_buffer_len, args.overlong_penalty_factor
                )

            every = [penalty(n) for n in whole.response_lengths]
            every_reward = [r + p for r, p in zip(every_reward, every, strict=True)]
            rewards = [every_reward[i] for i in share.rows]
            metrics["train/overlong_penalty_mean"] = sum(every) / max(1, len(every))
        normalized = bool(whole.reward_normalized) and all(whole.reward_normalized)  # by a slime post-process
        inputs = AdvantageInputs(rewards, data.group_ids, masks, old_lp, ref_lp, rollout_lp, values, normalized)
        if args.use_opd:
            inputs.teacher_log_probs = self._teacher_log_probs(share)
        if self.custom_advantage is not None:
            result = self._custom_advantages(share, inputs)
        else:
            scope = RolloutScope(share.rows, every_reward, whole.group_ids, partial(self._gather_rows, share))
            result = compute_advantages(args, inputs, None, scope)
        if values is not None and result.returns is None:
            raise ValueError("--custom-advantage-function-path with ppo must return Advantages(advantages, returns)")
        is_weights = self._is_weights(share, old_lp, rollout_lp, masks)
        old = (
            self._require_rollout(share, rollout_lp, "--use-rollout-logprobs") if args.use_rollout_logprobs else old_lp
        )
        if args.custom_tis_function_path:
            self._require_rollout(share, rollout_lp, "--custom-tis-function-path")
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
        metrics.update(self._rollout_metrics(share, result.advantages, masks, old_lp, rollout_lp, is_weights))
        if result.opd_reverse_kl is not None:  # slime's opd_reverse_kl: mean over the loss tokens
            tokens = max(1.0, sum(self._gather_rows(share, [float(m.sum()) for m in masks])))
            kl = sum(self._gather_rows(share, [float(k.sum()) for k in result.opd_reverse_kl]))
            metrics["train/opd_reverse_kl"] = kl / tokens
        return rows, metrics, routing

    def _custom_advantages(self, share: RankShare, inputs: AdvantageInputs) -> Advantages:
        """A custom advantage function sees the whole rollout, as it did when every rank held it: with DP > 1 the
        ranks' inputs are gathered (log-probs included: the price of a hook written for the whole rollout), the
        hook runs on every rank alike, and each rank keeps its own samples' results."""
        tokens = share.data.tokens
        if share.dp_size > 1:
            inputs, tokens = self._whole_inputs(share, inputs)
        custom = self.custom_advantage
        if self.slime_advantage:
            custom = partial(slime_advantages, fn=self.custom_advantage, tokens=tokens)
        result = compute_advantages(self.args, inputs, custom)
        if share.dp_size == 1:
            return result

        def mine(column: list[torch.Tensor] | None) -> list[torch.Tensor] | None:
            return None if column is None else [column[r] for r in share.rows]

        return Advantages(mine(result.advantages), mine(result.returns), mine(result.opd_reverse_kl))

    def _whole_inputs(self, share: RankShare, inputs: AdvantageInputs) -> tuple[AdvantageInputs, list[list[int]]]:
        """Every rank's advantage inputs and tokens, in rollout order (all_gather_object over the DP group)."""
        from megatron.core import parallel_state as mpu

        parts: list[Any] = [None] * share.dp_size
        torch.distributed.all_gather_object(
            parts, (share.rows, inputs, share.data.tokens), group=mpu.get_data_parallel_group()
        )
        where = {row: (part, i) for part, (rows, _, _) in enumerate(parts) for i, row in enumerate(rows)}
        order = [where[row] for row in range(len(share.rollout))]

        def column(name: str) -> Any:
            if getattr(inputs, name) is None or not isinstance(getattr(inputs, name), list):
                return getattr(inputs, name)
            return [getattr(parts[p][1], name)[i] for p, i in order]

        whole = AdvantageInputs(**{f.name: column(f.name) for f in fields(AdvantageInputs)})
        return whole, [parts[p][2][i] for p, i in order]

    def _teacher_log_probs(self, share: RankShare) -> list[torch.Tensor]:
        """--use-opd: this rank's samples' teacher log-probs (--opd-type megatron: the teacher's forward here; sglang:
        from the samples), or an error saying which samples have none."""
        if self.teacher_weights is not None:
            data = share.data
            self._before_log_prob("teacher_")
            return _response(self._forward_with_weights(self.teacher_weights, data.tokens), data.response_lengths)
        hint = (
            "with --opd-type sglang, use --custom-rm-path slime.rollout.on_policy_distillation.reward_func with the "
            "teacher's /generate URL as --rm-url"
        )
        teacher = _every_sample(share, "teacher_log_probs", "--use-opd", hint)
        return [torch.tensor(t, dtype=torch.float32) for t in teacher]

    def _rollout_routing(self, share: RankShare) -> list[Any]:
        """R3: this rank's samples' routed experts from SGLang, or an error saying which samples have none."""
        hint = (
            "a generate function must send return_routed_experts=True and keep the answer's "
            "meta_info['routed_experts'] (Sample.append_response_tokens does)"
        )
        return _every_sample(share, "rollout_routed_experts", "--use-rollout-routing-replay", hint)

    def _require_rollout(
        self, share: RankShare, rollout_lp: list[torch.Tensor | None], flag: str
    ) -> list[torch.Tensor]:
        """SGLang's log-probs of this rank's samples, or the same error on every rank if any sample lacks them."""
        missing = share.rollout.has_rollout_log_probs.count(False)
        if missing:
            raise ValueError(f"{flag} needs SGLang's log-probs, but {missing} samples have none")
        return rollout_lp  # type: ignore[return-value]

    def _is_weights(
        self,
        share: RankShare,
        old_lp: list[torch.Tensor],
        rollout_lp: list[torch.Tensor | None],
        masks: list[torch.Tensor],
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
        behaviour = self._require_rollout(share, rollout_lp, flag)
        return [weigh(o - b, m) for o, b, m in zip(old_lp, behaviour, masks, strict=True)]

    def _rollout_metrics(
        self,
        share: RankShare,
        advantages: list[torch.Tensor],
        masks: list[torch.Tensor],
        old_lp: list[torch.Tensor],
        rollout_lp: list[torch.Tensor | None],
        is_weights: list[torch.Tensor] | None,
    ) -> dict[str, float]:
        """Advantage statistics, train/rollout mismatch (where SGLang gave log-probs) and IS weight use, over the
        whole rollout (sums of every rank's samples, added in rollout order)."""

        def total(values: list[float]) -> float:
            return sum(self._gather_rows(share, values))

        counts = [float(m.sum()) for m in masks]
        tokens = max(1.0, total(counts))
        mean = total([float((a * m).sum()) for a, m in zip(advantages, masks, strict=True)]) / tokens
        var = total([float((((a - mean) ** 2) * m).sum()) for a, m in zip(advantages, masks, strict=True)]) / tokens
        metrics = {"train/advantage_mean": mean, "train/advantage_std": var**0.5}
        if any(share.rollout.has_rollout_log_probs):
            low, high = self.args.mis_low, self.args.mis_high
            parts = [
                {} if r is None else mismatch_sums(o, r, m, low, high)
                for o, r, m in zip(old_lp, rollout_lp, masks, strict=True)
            ]
            # A sample without SGLang's log-probs adds 0.0: the sums are those over the samples that have them.
            n = max(1.0, total([c if r is not None else 0.0 for c, r in zip(counts, rollout_lp, strict=True)]))
            for key, name in (("abs_diff", "logprob_abs_diff"), ("kl", "kl"), ("out_of_band", "out_of_band_frac")):
                metrics[f"train/train_rollout_{name}"] = total([p.get(key, 0.0) for p in parts]) / n
        if is_weights is not None:
            metrics["train/is_weight_mean"] = (
                total([float((w * m).sum()) for w, m in zip(is_weights, masks, strict=True)]) / tokens
            )
            metrics["train/is_dropped_frac"] = (
                total([float(((w == 0).float() * m).sum()) for w, m in zip(is_weights, masks, strict=True)]) / tokens
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
        # A LoRA run sends its adapter only: the servers keep the base they started with (weights/lora.py).
        export = self.engine.export_adapter if self.engine.lora is not None else self.engine.export_hf_weights
        used = self.transport.update(export, version, mode)
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
        if self.engine.lora is not None:  # no full-weight fallback: it would replace the base the adapter is for
            from slime_like.weights.lora import LoraTransport

            directory = os.path.join(output_dir, "lora")
            settings = self.engine.lora
            factory = {
                "lora": lambda: LoraTransport(server_urls, settings, args.hf_checkpoint, directory, timeout_s=timeout)
            }
            return WeightUpdater(factory, "lora", None, args.update_weight_retries, self.rank)
        factories = {
            # Rank 0's node address (MASTER_ADDR): engines on other nodes join the weight group there.
            "distributed": lambda: DistributedTransport(
                server_urls, size, tp_per_server=tp, master_address=self.master_addr, timeout_s=timeout
            ),
            "tensor": lambda: TensorTransport(server_urls, size, tp_per_server=tp, timeout_s=timeout),
            "disk": lambda: DiskTransport(server_urls, size, args.hf_checkpoint, disk_dir, timeout_s=timeout),
        }
        disk_dir = args.update_weight_disk_dir or os.path.join(output_dir, "weights")
        if args.update_weight_local_checkpoint_dir:  # delta, or full versions pulled to host-local disks
            from slime_like.weights.delta import make_delta_transport

            factories["disk"] = lambda: make_delta_transport(args, server_urls, disk_dir)
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


def _every_sample(share: RankShare, column: str, flag: str, hint: str) -> list[Any]:
    """This rank's values of a per-sample column `flag` needs, or an error (the same on every rank: the check
    reads the rollout-wide flags) naming the samples that lack it and how to fill it."""
    whole = share.rollout
    has = whole.has_teacher_log_probs if column == "teacher_log_probs" else whole.has_routed_experts
    missing = [whole.sample_indices[i] for i, ok in enumerate(has) if not ok]
    if missing:
        raise ValueError(
            f"{flag}: {len(missing)} of {len(whole)} samples have no {column} (sample indices {missing[:8]}): {hint}"
        )
    return getattr(share.data, column)
