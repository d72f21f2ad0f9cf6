"""MegatronTrainEngine: packed log-prob forwards and optimizer steps on Megatron model chunks.

Batches are lists of variable-length token sequences. By default the caller passes the FULL global batch
(the same list on every rank) and the engine splits it over data-parallel ranks itself (token-balanced,
deterministic). With local=True the caller passes this DP rank's share (the trainer's path: the rollout side
split the rollout, buffer/train_data.py) and per-sequence outputs stay on the rank. Either way each rank's
sequences are packed into micro-batches of at most `max_tokens_per_micro_batch` tokens and run through
Megatron's forward-backward schedule (1F1B when PP > 1).

Micro-batch layout (packing.py, schedule.py): "thd" with Transformer Engine (one row, PackedSeqParams, each sequence
padded for sequence/context parallel), "packed" on Megatron's local spec (one row, block-diagonal mask);
"padded" (a row per sequence) is the fallback, chosen with layout= or SLIME_LIKE_MICRO_BATCH_LAYOUT.
With context parallel each CP rank runs its zig-zag share of every micro-batch and the per-sequence
outputs are gathered back in full on every CP rank (context_parallel.py).

Loss normalisation in `train_step`: `loss_fn` returns its micro-batch's share of the global objective,
already divided by the global normaliser (e.g. the token count of the whole batch, which the caller
can compute because it holds the whole batch). The engine multiplies each share by loss_rescale(), which
undoes Megatron's averaging, so the gradient is exactly the gradient of the sum of shares over all
micro-batches and DP ranks (each CP rank computes the same shares; see context_parallel.py for why
they count once). With MTP layers (mtp_layers > 0, --enable-mtp-training) each training micro-batch's share also
carries its part of the scaled MTP loss (mtp.py), rescaled the same way.

A step whose loss or gradients are not finite (NaN/inf) is skipped on every rank alike: the optimizer and the
learning-rate schedule do not move, a warning says so, and the step's metrics carry skipped_steps=1 and
update_successful=0. (Megatron's fp32 and bf16 optimizers have no loss scaler, so they would apply it.)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import torch
from megatron.core.utils import get_model_config

from buffer.train_data import TrainData
from slime_like.trainer.megatron import context_parallel as cp_lib
from slime_like.trainer.megatron import lora as lora_lib
from slime_like.trainer.megatron import model as model_lib
from slime_like.trainer.megatron import mtp as mtp_lib
from slime_like.trainer.megatron import routing_replay as replay_lib
from slime_like.trainer.megatron import vision_language as vl_lib
from slime_like.trainer.megatron.cpu_compat import ON_CUDA, cuda_to_cpu
from slime_like.trainer.megatron.frozen_weights import FrozenWeights
from slime_like.trainer.megatron.logprobs import logprobs_and_entropy
from slime_like.trainer.megatron.optimizer import OptimizerSettings, build_optimizer
from slime_like.trainer.megatron.packing import MicroBatch, pad_multiple
from slime_like.trainer.megatron.parallel import share_from_last_stage
from slime_like.trainer.megatron.schedule import (
    choose_layout,
    loss_rescale,
    merge_indexed,
    micro_batch_data,
    plan_micro_batches,
    sum_dicts,
)
from slime_like.trainer.megatron.step_guard import all_finite, discard_grads
from slime_like.trainer.megatron.value_head import value_head_callback, value_heads_hidden

logger = logging.getLogger(__name__)

# loss_fn(logprobs_per_seq, data_per_seq[, entropy=entropy_per_seq]) -> share | (share, metrics)
LossFn = Callable[..., torch.Tensor | tuple[torch.Tensor, dict[str, Any]]]


class MegatronTrainEngine:
    """A Megatron actor backend: log-probs, train steps, HF export and checkpoints of one model."""

    def __init__(
        self,
        hf_dir: str | Path,
        optimizer: OptimizerSettings | None = None,
        max_tokens_per_micro_batch: int = 8192,
        dtype: torch.dtype = torch.float32,
        temperature: float = 1.0,
        value_head: bool = False,
        layout: str | None = None,
        mtp_layers: int = 0,
        mtp_loss_scaling_factor: float = 0.2,
        lora: lora_lib.LoraSettings | None = None,
        freeze: Callable[..., None] | None = None,
        train_vision: bool = True,
        **config_overrides: Any,
    ) -> None:
        """Build the model from an HF checkpoint (after init_parallel); optimizer=None: forward only.

        value_head=True builds a critic: the output layer is a zero-initialised hidden -> 1 linear
        (mbridge's value model), and the per-sequence outputs are values instead of log-probs.
        layout: the micro-batch layout (choose_layout; None picks the fast one for the attention used).
        mtp_layers > 0 builds and trains that many multi-token-prediction layers (mtp.py, --enable-mtp-training).
        lora: LoRA adapters on the linear layers, the base frozen and the optimizer over the adapters only (lora.py).
        freeze: an mbridge post-creation callback that sets requires_grad (the freeze flags, trainer/train_options.py);
        train_vision=False freezes a VL model's vision tower too (vision_language.freeze_tower).
        """
        from megatron.core import parallel_state as mpu
        from megatron.core.distributed import finalize_model_grads

        self.max_tokens = max_tokens_per_micro_batch
        self.dtype = dtype
        self.temperature = temperature
        self.value_head = value_head
        self.bridge = model_lib.make_bridge(hf_dir, dtype, **config_overrides)
        self.transformer_engine = model_lib.uses_transformer_engine(self.bridge)
        # torch's core attention (torch_attention.py) takes THD micro-batches as TE does.
        self.layout = choose_layout(layout, model_lib.takes_packed_sequences(self.bridge))
        self.cp_size = mpu.get_context_parallel_world_size()
        if self.cp_size > 1 and self.layout != "thd":
            raise ValueError(
                f"--context-parallel-size {self.cp_size} needs the 'thd' micro-batch layout, not {self.layout!r}"
            )
        callbacks = [value_head_callback] if value_head else []
        self.lora = lora
        if lora is not None:  # adapters are added and the base frozen before DDP builds its gradient buffers
            sequence_parallel = bool(getattr(self.bridge.config, "sequence_parallel", False))
            lora_lib.check_supported(
                mpu.get_pipeline_model_parallel_world_size(),
                sequence_parallel,
                self.transformer_engine,
                mpu.get_tensor_model_parallel_world_size(),
                lora.dropout,
            )
            callbacks.append(lora_lib.lora_callback(lora))
        callbacks += [c for c in (freeze, None if train_vision else vl_lib.freeze_tower) if c is not None]
        if callbacks:
            self.bridge.get_model = partial(self.bridge.get_model, post_model_creation_callbacks=callbacks)
        if mtp_layers:
            if value_head:
                raise ValueError("MTP layers belong to the policy: a critic (value_head=True) is built without them")
            mtp_lib.enable_mtp(self.bridge, mtp_layers, mtp_loss_scaling_factor)
        distributed_optimizer = optimizer is not None and optimizer.use_distributed_optimizer
        self.model = model_lib.build_model(self.bridge, optimizer is not None, distributed_optimizer)
        self.mtp = mtp_lib.MTPTraining(self.model, mtp_layers, mtp_loss_scaling_factor) if mtp_layers else None
        self.vision = vl_lib.is_vision_language(self.model, self.cp_size)
        with value_heads_hidden(self.model) if value_head else nullcontext():
            model_lib.load_hf_weights(self.bridge, self.model, hf_dir)
        self.frozen = FrozenWeights(self.bridge, self.model)  # what an in-place weight update may leave out
        self.optimizer = self.scheduler = None
        self.skipped_steps_total = 0  # optimizer steps skipped for a non-finite loss or gradient
        config = get_model_config(self.model[0])
        # Sequences are padded so that the CP split and the SP split of every micro-batch come out even.
        tp = mpu.get_tensor_model_parallel_world_size()
        self.pad_multiple = pad_multiple(tp, self.cp_size, config.sequence_parallel)
        self.device = torch.device("cuda", torch.cuda.current_device()) if ON_CUDA else torch.device("cpu")
        if optimizer is not None:
            # Weights are loaded first: the optimizer copies them into its main (fp32) params.
            self.optimizer, self.scheduler = build_optimizer(self.model, optimizer, dtype)
            config.finalize_model_grads_func = finalize_model_grads
            config.grad_scale_func = self.optimizer.scale_loss
            no_sync = [m.no_sync for m in self.model]
            config.no_sync_func = no_sync[0] if len(no_sync) == 1 else no_sync
        # MoE routing replay (routing_replay.py): the routers that replay, per model chunk, when the config asks.
        self.routers = {id(chunk): replay_lib.find_routers(chunk) for chunk in self.model}
        if any(self.routers.values()):
            replay_lib.check_replayable(config)

    def forward_logprobs(
        self,
        sequences: Sequence[Sequence[int] | torch.Tensor],
        with_entropy: bool = False,
        routing: Sequence[Any] | None = None,
        local: bool = False,
        multimodal: Sequence[dict[str, Any] | None] | None = None,
    ) -> list[torch.Tensor] | tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per sequence (of the full batch on every rank; local=True: of this DP rank's share):
        log p(token_t | tokens_<t) for t >= 1 [, entropies].

        routing: per sequence the experts to replay, [L - 1, layers, topk] (routing_replay.py; None: route freely).
        multimodal: per sequence its processor tensors (pixel_values, image_grid_thw) or None (vision_language.py)."""
        for m in self.model:
            m.eval()
        collect = partial(self._collect, with_entropy=with_entropy)
        with torch.no_grad():
            replay = self._replay(routing)
            stores = self._run(sequences, collect, forward_only=True, replay=replay, local=local, multimodal=multimodal)
        outputs = {i: v for store in stores for i, v in store.items()}
        merged = share_from_last_stage(outputs, merge_indexed, over_dp=not local)
        logprobs = [merged[i][0] for i in range(len(sequences))]
        return (logprobs, [merged[i][1] for i in range(len(sequences))]) if with_entropy else logprobs

    def forward_logprobs_and_routing(
        self,
        sequences: Sequence[Sequence[int] | torch.Tensor],
        local: bool = False,
        multimodal: Sequence[dict[str, Any] | None] | None = None,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """forward_logprobs, and the experts each MoE router picked per sequence, [L - 1, layers, topk] int32 on
        every rank (--use-routing-replay records them in the old-policy forward); local=True as forward_logprobs."""
        from megatron.core import parallel_state as mpu

        for m in self.model:
            m.eval()
        replay = self._replay(None, record=True)
        with torch.no_grad():
            collect = partial(self._collect, with_entropy=False)
            stores = self._run(sequences, collect, forward_only=True, replay=replay, local=local, multimodal=multimodal)
        outputs = {i: v for store in stores for i, v in store.items()}
        merged = share_from_last_stage(outputs, merge_indexed, over_dp=not local)
        # Each rank recorded its DP share's sequences for its pipeline stage's layers: every rank gets them all
        # (local: its share's, from every stage).
        parts = [replay.local_recorded()]
        groups = [] if local else [(mpu.get_data_parallel_world_size(), mpu.get_data_parallel_group())]
        groups.append((mpu.get_pipeline_model_parallel_world_size(), mpu.get_pipeline_model_parallel_group()))
        for size, group in groups:
            if size > 1:
                gathered: list[Any] = [None] * size
                torch.distributed.all_gather_object(gathered, parts, group=group)
                parts = [p for ps in gathered for p in ps]
        config = get_model_config(self.model[0])
        routing = replay_lib.assemble(parts, len(sequences), config.num_layers, config.moe_router_topk)
        return [merged[i][0] for i in range(len(sequences))], routing

    def forward_values(
        self,
        sequences: Sequence[Sequence[int] | torch.Tensor],
        local: bool = False,
        multimodal: Sequence[dict[str, Any] | None] | None = None,
    ) -> list[torch.Tensor]:
        """A critic's (value_head=True) per-sequence values of the states before tokens 1..L-1."""
        assert self.value_head, "engine was built without a value head"
        return self.forward_logprobs(sequences, local=local, multimodal=multimodal)

    def train_step(
        self,
        sequences: Sequence[Sequence[int] | torch.Tensor],
        per_sequence_data: TrainData | Sequence[Any],
        loss_fn: LossFn,
        with_entropy: bool = False,
        entropy_grad: bool = True,
        routing: Sequence[Any] | None = None,
        local: bool = False,
        mtp_loss_masks: Sequence[torch.Tensor] | None = None,
    ) -> dict[str, float]:
        """One optimizer step on the full batch (local=True: on this DP rank's share of the step); returns the loss
        and metric shares summed over all ranks, grad_norm and lr.

        per_sequence_data: the training batch of `sequences` (each micro-batch's rows go to loss_fn as a TrainData),
        or any per-sequence list (loss_fn then gets the micro-batch's items).
        entropy_grad=False hands loss_fn entropies without a graph (a metric only): no [T, V] backward.
        routing: per sequence the experts to replay in the forward (and any recompute), as in forward_logprobs.
        mtp_loss_masks: with MTP layers, per sequence the tokens the MTP loss counts, aligned with its log-probs.
        The images of a vision-language batch come from per_sequence_data.multimodal_train_inputs (a TrainData)."""
        assert self.optimizer is not None, "engine was built without an optimizer"
        assert len(per_sequence_data) == len(sequences), "one data item per sequence"
        multimodal = vl_lib.training_images(per_sequence_data, self.model) if self.vision else None
        if self.mtp is not None:
            if mtp_loss_masks is None:
                raise ValueError("this engine trains MTP layers (--enable-mtp-training): pass mtp_loss_masks")
            self.mtp.begin_step([len(s) for s in sequences], mtp_loss_masks, dp_sum=local)
        for m in self.model:
            m.train()
            m.zero_grad_buffer()
        self.optimizer.zero_grad()
        compute = partial(
            self._loss, data=per_sequence_data, loss_fn=loss_fn, with_entropy=with_entropy, entropy_grad=entropy_grad
        )
        try:
            replay = self._replay(routing)
            stores = self._run(
                sequences, compute, forward_only=False, replay=replay, local=local, multimodal=multimodal
            )
        finally:
            if self.mtp is not None:
                self.mtp.end_step()
        totals: dict[str, float] = {}
        for store in stores:
            for key, value in store.items():
                totals[key] = totals.get(key, 0.0) + float(value)
        if all_finite(self.model, totals.get("loss", 0.0), self.device):
            with cuda_to_cpu():
                ok, grad_norm, _ = self.optimizer.step()
        else:
            ok, grad_norm = False, math.nan
            discard_grads(self.model, self.optimizer)
        lr = self.optimizer.param_groups[0]["lr"]
        if ok:
            self.scheduler.step(1)
        else:
            self.skipped_steps_total += 1
            logger.warning(
                "optimizer step skipped: the loss or a gradient is not finite (loss share %s on this rank); the "
                "weights, optimizer state and learning rate are unchanged (%d step(s) skipped so far)",
                totals.get("loss"),
                self.skipped_steps_total,
            )
        metrics = share_from_last_stage(totals, sum_dicts)
        metrics.update(
            grad_norm=float(grad_norm if grad_norm is not None else 0.0),
            lr=float(lr),
            update_successful=float(ok),
            skipped_steps=float(not ok),
        )
        return metrics

    def export_hf_weights(self, in_place: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (hf_name, full tensor) on every rank (gathered over TP/PP; views of live params); in_place: without
        the frozen weights every engine holds already (an in-place update's tensors: frozen_weights.py)."""
        skip = self.frozen.held_by_engines() if in_place else frozenset()
        return model_lib.export_hf_weights(self.bridge, self.model, skip)

    def export_adapter(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (PEFT key, full tensor) of the LoRA adapter on every rank (a collective: gathers over TP)."""
        assert self.lora is not None, "engine was built without LoRA"
        return lora_lib.export_adapter(self.model, self.bridge.hf_config, get_model_config(self.model[0]))

    def save_adapter(self, directory: str | Path) -> Path | None:
        """Save the LoRA adapter in HF PEFT format (a collective; rank 0 writes and gets the directory)."""
        assert self.lora is not None, "engine was built without LoRA"
        base = str(self.bridge.slime_like_hf_dir)
        config = get_model_config(self.model[0])
        return lora_lib.save_adapter(self.model, self.bridge.hf_config, config, self.lora, directory, base)

    def load_adapter(self, directory: str | Path) -> None:
        """Set the LoRA adapter from an HF PEFT adapter directory (of this engine's rank and alpha)."""
        assert self.lora is not None, "engine was built without LoRA"
        config = get_model_config(self.model[0])
        lora_lib.load_adapter(self.model, self.bridge.hf_config, config, self.lora, directory)

    def save_checkpoint(self, directory: str | Path, iteration: int = 0, with_optimizer: bool = True) -> None:
        """Save model, optimizer, scheduler and RNG states with Megatron dist_checkpointing (torch_dist); without
        the optimizer and scheduler when with_optimizer is False (--no-save-optim)."""
        from slime_like.trainer.megatron.checkpoint import save_checkpoint

        optimizer, scheduler = (self.optimizer, self.scheduler) if with_optimizer else (None, None)
        save_checkpoint(directory, self.model, optimizer, scheduler, iteration=iteration)

    def load_checkpoint(self, directory: str | Path, load_optimizer: bool = True, load_rng: bool = True) -> None:
        """Load a torch_dist checkpoint (ours, Megatron-LM's or slime's; any layout for the model); the optimizer
        and RNG states too when asked and the checkpoint holds them for this engine."""
        from slime_like.trainer.megatron.checkpoint import load_checkpoint

        load_checkpoint(
            directory, self.model, self.optimizer, self.scheduler, load_optimizer=load_optimizer, load_rng=load_rng
        )
        self.frozen.recheck()  # its frozen weights may not be --hf-checkpoint's (compared when next exported)

    def load_model_weights(self, directory: str | Path) -> None:
        """Set the model's weights from a torch_dist checkpoint; the optimizer is left as it is (not told)."""
        from slime_like.trainer.megatron.checkpoint import load_checkpoint

        load_checkpoint(directory, self.model, weights_only=True)
        self.frozen.recheck()

    # ---- internals ----

    def _plan(self, sequences: Sequence[Sequence[int] | torch.Tensor], local: bool = False) -> list[MicroBatch]:
        """This DP rank's micro-batches (schedule.plan_micro_batches)."""
        return plan_micro_batches(
            sequences, self.layout, self.pad_multiple, self.max_tokens, len(self.model), self.device, local
        )

    def _shard(self, mb: MicroBatch) -> cp_lib.CPShard | None:
        """This CP rank's zig-zag share of a micro-batch (None without context parallel)."""
        from megatron.core import parallel_state as mpu

        return cp_lib.shard(mb, self.cp_size, mpu.get_context_parallel_rank()) if self.cp_size > 1 else None

    def _replay(self, routing: Sequence[Any] | None, record: bool = False) -> replay_lib.RoutingReplay | None:
        """The routing replay (or recording) of one pass; None when there is nothing to replay."""
        if routing is None and not record:
            return None
        from megatron.core import parallel_state as mpu

        if not any(self.routers.values()) and mpu.get_pipeline_model_parallel_world_size() == 1:
            raise ValueError(
                "routing replay needs an MoE model built with moe_enable_routing_replay=True "
                "(--use-routing-replay / --use-rollout-routing-replay)"
            )
        config = get_model_config(self.model[0])
        sp = mpu.get_tensor_model_parallel_world_size() if config.sequence_parallel else 1
        return replay_lib.RoutingReplay(
            self.routers,
            config.num_layers,
            config.moe_router_topk,
            config.num_moe_experts,
            routing,
            cp=(self.cp_size, mpu.get_context_parallel_rank()),
            sp=(sp, mpu.get_tensor_model_parallel_rank()),
            groups=(mpu.get_context_parallel_group(), mpu.get_tensor_model_parallel_group()),
        )

    def _run(
        self, sequences, compute: Callable, forward_only: bool, replay=None, local: bool = False, multimodal=None
    ) -> list[dict]:
        """Run Megatron's forward-backward schedule; `compute(mb, shard, num_mb, output)` is the loss function;
        `replay` (routing_replay.RoutingReplay) sets the routers' experts around each micro-batch's forward;
        `multimodal` gives each micro-batch's images to a vision-language model (vision_language.micro_batch_inputs)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        if multimodal is not None and not self.vision:
            vl_lib.refuse_images(multimodal, self.bridge.hf_config)
        micro_batches = self._plan(sequences, local)
        num_mb = len(micro_batches)

        def forward_step(data_iterator, model):
            mb = next(data_iterator)
            shard = self._shard(mb)
            tokens, positions = (mb.tokens, mb.position_ids) if shard is None else (shard.tokens, shard.position_ids)
            # TE's causal attention ignores an explicit mask; THD boundaries travel in packed_seq_params.
            mask = None if self.transformer_engine or mb.attention_mask is None else mb.attention_mask.to(self.device)
            if replay is not None:
                replay.before(model, mb)
            with_mtp = self.mtp is not None and not forward_only and self.mtp.on(model)  # the last PP stage's
            if with_mtp:
                self.mtp.set_targets(model, mb, self.device, shard)
            images = vl_lib.micro_batch_inputs(multimodal, mb.indices, self.device) if self.vision else {}
            output = model(
                tokens.to(self.device),
                positions.to(self.device),
                mask,
                packed_seq_params=mb.packed_seq_params(self.device),
                **images,
            )
            if replay is not None:
                replay.after(model, mb)
            if with_mtp:
                mtp_loss = self.mtp.take_loss(model)
                return output, partial(self._with_mtp_loss, mtp_loss, num_mb, partial(compute, mb, shard, num_mb))
            return output, partial(compute, mb, shard, num_mb)

        iterators = [iter(micro_batches) for _ in self.model]
        try:
            with cuda_to_cpu():
                return get_forward_backward_func()(
                    forward_step_func=forward_step,
                    data_iterator=iterators if len(iterators) > 1 else iterators[0],
                    model=self.model,
                    num_microbatches=num_mb,
                    seq_length=max(mb.tokens.shape[1] for mb in micro_batches),
                    micro_batch_size=1,
                    forward_only=forward_only,
                )
        finally:
            if replay is not None:
                replay.finish()

    def _per_sequence(self, mb: MicroBatch, shard: cp_lib.CPShard | None, values: torch.Tensor) -> list[torch.Tensor]:
        """Per-sequence values from per-position ones (this CP rank's positions: gathered in full first)."""
        if shard is not None:
            from megatron.core import parallel_state as mpu

            values = cp_lib.gather(values, shard, mpu.get_context_parallel_group())
        return mb.per_sequence(values)

    def _outputs(
        self,
        mb: MicroBatch,
        shard: cp_lib.CPShard | None,
        logits: torch.Tensor,
        with_entropy: bool,
        entropy_grad: bool = True,
    ):
        """Per-sequence log-probs (and entropies) of one micro-batch from its logits; values for a critic."""
        if self.value_head:  # outputs are [rows, T, 1] values: position j values the state before token j+1
            return self._per_sequence(mb, shard, logits[..., 0].float()), None
        if self.temperature != 1.0:
            logits = logits / self.temperature
        targets = (mb.targets if shard is None else shard.targets).to(logits.device)
        logprobs, entropy = logprobs_and_entropy(logits, targets, with_entropy, entropy_grad)
        entropy = None if entropy is None else self._per_sequence(mb, shard, entropy)
        return self._per_sequence(mb, shard, logprobs), entropy

    def _collect(self, mb: MicroBatch, shard, num_mb: int, logits: torch.Tensor, with_entropy: bool):
        """Forward-only loss function: store per-sequence outputs by batch index."""
        logprobs, entropy = self._outputs(mb, shard, logits, with_entropy)
        entropy = entropy or [None] * len(logprobs)
        real = [i for i in mb.indices if i >= 0]
        store = {
            i: (lp.cpu(), None if e is None else e.cpu()) for i, lp, e in zip(real, logprobs, entropy, strict=True)
        }
        return logits.new_zeros(()), store

    @staticmethod
    def _with_mtp_loss(mtp: tuple[torch.Tensor, dict[str, torch.Tensor]], num_mb: int, loss: Callable, logits):
        """A training loss function's result with this micro-batch's MTP loss share added (mtp.py) and logged."""
        share, reported = loss(logits)
        mtp_share, metrics = mtp
        # Rescaled as the policy share is (loss_rescale); the logged "loss" stays the policy loss, as in slime.
        return share + mtp_share * loss_rescale(num_mb), {**reported, **metrics}

    def _loss(self, mb, shard, num_mb, logits, data, loss_fn: LossFn, with_entropy: bool, entropy_grad: bool):
        """Training loss function: the user's share, rescaled to survive Megatron's averaging."""
        real = [i for i in mb.indices if i >= 0]
        metrics: dict[str, Any] = {}
        if not real:
            share = logits.sum() * 0.0  # filler micro-batch: zero gradient, but a graph to backprop
        else:
            logprobs, entropy = self._outputs(mb, shard, logits, with_entropy, entropy_grad)
            kwargs = {"entropy": entropy} if with_entropy else {}
            result = loss_fn(logprobs, micro_batch_data(data, real, logits.device), **kwargs)
            share, metrics = result if isinstance(result, tuple) else (result, {})
        reported = {"loss": share.detach(), **{k: torch.as_tensor(v).detach() for k, v in metrics.items()}}
        return share * loss_rescale(num_mb), reported
