"""MegatronTrainEngine: packed log-prob forwards and optimizer steps on Megatron model chunks.

Batches are lists of variable-length token sequences. The caller always passes the FULL global batch
(the same list on every rank); the engine splits it over data-parallel ranks itself (token-balanced,
deterministic), packs each rank's share into micro-batches of at most `max_tokens_per_micro_batch`
tokens, and runs Megatron's forward-backward schedule (1F1B when PP > 1).

Loss normalisation in `train_step`: `loss_fn` returns its micro-batch's share of the global objective,
already divided by the global normaliser (e.g. the token count of the whole batch, which the caller
can compute because it holds the whole batch). The engine multiplies each share by
num_microbatches * dp_size before Megatron divides by num_microbatches and DDP averages over DP, so
the gradient is exactly the gradient of the sum of shares over all micro-batches and DP ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import torch

from slime_like.megatron import model as model_lib
from slime_like.megatron.cpu_compat import cuda_to_cpu
from slime_like.megatron.logprobs import logprobs_and_entropy
from slime_like.megatron.optimizer import OptimizerSettings, build_optimizer
from slime_like.megatron.packing import MicroBatch, pack, split_for_dp, split_micro_batches
from slime_like.megatron.parallel import share_from_last_stage

# loss_fn(logprobs_per_seq, data_per_seq[, entropy=entropy_per_seq]) -> share | (share, metrics)
LossFn = Callable[..., torch.Tensor | tuple[torch.Tensor, dict[str, Any]]]


def _sum_dicts(parts: list[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for part in parts:
        for key, value in part.items():
            total[key] = total.get(key, 0.0) + value
    return total


def _value_head(model, pre_process, post_process, config, hf_config) -> None:
    """mbridge post-creation callback: replace the output layer by a zero-initialised hidden -> 1 linear.

    Zero init makes every rank's head identical without relying on RNG state, and the first values 0.
    mbridge's load_weights skips a [1, hidden] output layer, so the trunk still loads from HF.
    """
    from mbridge.utils.post_creation_callbacks import make_value_model

    make_value_model(model, pre_process, post_process, config, hf_config)
    if post_process:
        torch.nn.init.zeros_(model.output_layer.weight)


@contextmanager
def _value_heads_hidden(model: list[torch.nn.Module]) -> Iterator[None]:
    """Hide value heads from state_dict while HF weights load: mbridge would map them to the LM head
    (or, with tied embeddings, load the embedding twice and fail); they keep their zero init."""
    hidden = []
    for chunk in model:
        while hasattr(chunk, "module"):
            chunk = chunk.module
        if getattr(chunk, "output_layer", None) is not None:
            hidden.append((chunk, chunk.output_layer))
            chunk.output_layer = None
    try:
        yield
    finally:
        for chunk, head in hidden:
            chunk.output_layer = head


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
        **config_overrides: Any,
    ) -> None:
        """Build the model from an HF checkpoint (after init_parallel); optimizer=None: forward only.

        value_head=True builds a critic: the output layer is a zero-initialised hidden -> 1 linear
        (mbridge's value model), and the per-sequence outputs are values instead of log-probs.
        """
        from megatron.core.distributed import finalize_model_grads
        from megatron.core.utils import get_model_config

        self.max_tokens = max_tokens_per_micro_batch
        self.temperature = temperature
        self.value_head = value_head
        self.bridge = model_lib.make_bridge(hf_dir, dtype, **config_overrides)
        if value_head:
            self.bridge.get_model = partial(self.bridge.get_model, post_model_creation_callbacks=[_value_head])
        distributed_optimizer = optimizer is not None and optimizer.use_distributed_optimizer
        self.model = model_lib.build_model(self.bridge, optimizer is not None, distributed_optimizer)
        with _value_heads_hidden(self.model) if value_head else nullcontext():
            model_lib.load_hf_weights(self.bridge, self.model, hf_dir)
        # TE's causal attention ignores explicit masks: give it one right-padded row per sequence.
        self.layout = "padded" if model_lib.uses_transformer_engine(self.bridge) else "packed"
        self.optimizer = self.scheduler = None
        config = get_model_config(self.model[0])
        if optimizer is not None:
            # Weights are loaded first: the optimizer copies them into its main (fp32) params.
            self.optimizer, self.scheduler = build_optimizer(self.model, optimizer, dtype)
            config.finalize_model_grads_func = finalize_model_grads
            config.grad_scale_func = self.optimizer.scale_loss
            no_sync = [m.no_sync for m in self.model]
            config.no_sync_func = no_sync[0] if len(no_sync) == 1 else no_sync

    def forward_logprobs(
        self, sequences: Sequence[Sequence[int] | torch.Tensor], with_entropy: bool = False
    ) -> list[torch.Tensor] | tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per sequence (full batch, on every rank): log p(token_t | tokens_<t) for t >= 1 [, entropies]."""
        for m in self.model:
            m.eval()
        collect = partial(self._collect, with_entropy=with_entropy)
        with torch.no_grad():
            stores = self._run(sequences, collect, forward_only=True)
        local = {i: v for store in stores for i, v in store.items()}
        merged = share_from_last_stage(local, lambda parts: {i: v for part in parts for i, v in part.items()})
        logprobs = [merged[i][0] for i in range(len(sequences))]
        return (logprobs, [merged[i][1] for i in range(len(sequences))]) if with_entropy else logprobs

    def forward_values(self, sequences: Sequence[Sequence[int] | torch.Tensor]) -> list[torch.Tensor]:
        """A critic's (value_head=True) per-sequence values of the states before tokens 1..L-1."""
        assert self.value_head, "engine was built without a value head"
        return self.forward_logprobs(sequences)

    def train_step(
        self,
        sequences: Sequence[Sequence[int] | torch.Tensor],
        per_sequence_data: Sequence[Any],
        loss_fn: LossFn,
        with_entropy: bool = False,
        entropy_grad: bool = True,
    ) -> dict[str, float]:
        """One optimizer step on the full batch; returns summed loss/metric shares, grad_norm and lr.

        entropy_grad=False hands loss_fn entropies without a graph (a metric only): no [T, V] backward."""
        assert self.optimizer is not None, "engine was built without an optimizer"
        assert len(per_sequence_data) == len(sequences), "one data item per sequence"
        from megatron.core import parallel_state as mpu

        for m in self.model:
            m.train()
            m.zero_grad_buffer()
        self.optimizer.zero_grad()
        scale = mpu.get_data_parallel_world_size()  # times num_microbatches, set in _run
        compute = partial(
            self._loss,
            data=per_sequence_data,
            loss_fn=loss_fn,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
            dp_scale=scale,
        )
        stores = self._run(sequences, compute, forward_only=False)
        with cuda_to_cpu():
            ok, grad_norm, _ = self.optimizer.step()
        lr = self.optimizer.param_groups[0]["lr"]
        if ok:
            self.scheduler.step(1)
        totals: dict[str, float] = {}
        for store in stores:
            for key, value in store.items():
                totals[key] = totals.get(key, 0.0) + float(value)
        metrics = share_from_last_stage(totals, _sum_dicts)
        metrics.update(grad_norm=float(grad_norm or 0.0), lr=float(lr), update_successful=float(ok))
        return metrics

    def export_hf_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (hf_name, full tensor) on every rank (gathered over TP/PP; views of live params)."""
        return model_lib.export_hf_weights(self.bridge, self.model)

    def save_checkpoint(self, directory: str | Path) -> None:
        """Save model, optimizer, scheduler and RNG states with Megatron dist_checkpointing (torch_dist)."""
        from slime_like.megatron.checkpoint import save_checkpoint

        save_checkpoint(directory, self.model, self.optimizer, self.scheduler)

    def load_checkpoint(self, directory: str | Path) -> None:
        """Load what save_checkpoint wrote (same parallel layout not required for the model)."""
        from slime_like.megatron.checkpoint import load_checkpoint

        load_checkpoint(directory, self.model, self.optimizer, self.scheduler)

    # ---- internals ----

    def _plan(self, sequences: Sequence[Sequence[int] | torch.Tensor]) -> list[MicroBatch]:
        """This DP rank's micro-batches; every DP rank gets the same count (filler micro-batches)."""
        from megatron.core import parallel_state as mpu

        lengths = [len(s) for s in sequences]
        shares = split_for_dp(lengths, mpu.get_data_parallel_world_size())
        plans = [split_micro_batches(share, lengths, self.max_tokens) for share in shares]
        count = max(1, *(len(p) for p in plans))
        if len(self.model) > 1:  # the interleaved (VPP) schedule wants a multiple of PP micro-batches
            pp = mpu.get_pipeline_model_parallel_world_size()
            count = -(-count // pp) * pp
        mine = plans[mpu.get_data_parallel_rank()]
        mine = mine + [[] for _ in range(count - len(mine))]
        return [pack(sequences, ids, self.layout) for ids in mine]

    def _run(self, sequences, compute: Callable, forward_only: bool) -> list[dict]:
        """Run Megatron's forward-backward schedule; `compute(mb, num_mb, output)` is the loss function."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        micro_batches = self._plan(sequences)
        num_mb = len(micro_batches)

        def forward_step(data_iterator, model):
            mb = next(data_iterator)
            mask = None if self.layout == "padded" else mb.attention_mask
            output = model(mb.tokens, mb.position_ids, mask)
            return output, partial(compute, mb, num_mb)

        iterators = [iter(micro_batches) for _ in self.model]
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

    def _outputs(self, mb: MicroBatch, logits: torch.Tensor, with_entropy: bool, entropy_grad: bool = True):
        """Per-sequence log-probs (and entropies) of one micro-batch from its logits; values for a critic."""
        if self.value_head:  # outputs are [rows, T, 1] values: position j values the state before token j+1
            return mb.per_sequence(logits[..., 0].float()), None
        if self.temperature != 1.0:
            logits = logits / self.temperature
        logprobs, entropy = logprobs_and_entropy(logits, mb.tokens, with_entropy, entropy_grad)
        return mb.per_sequence(logprobs), None if entropy is None else mb.per_sequence(entropy)

    def _collect(self, mb: MicroBatch, num_mb: int, logits: torch.Tensor, with_entropy: bool):
        """Forward-only loss function: store per-sequence outputs by batch index."""
        logprobs, entropy = self._outputs(mb, logits, with_entropy)
        entropy = entropy or [None] * len(logprobs)
        real = [i for i in mb.indices if i >= 0]
        store = {
            i: (lp.cpu(), None if e is None else e.cpu()) for i, lp, e in zip(real, logprobs, entropy, strict=True)
        }
        return logits.new_zeros(()), store

    def _loss(self, mb, num_mb, logits, data, loss_fn: LossFn, with_entropy: bool, entropy_grad: bool, dp_scale: int):
        """Training loss function: the user's share, rescaled to survive Megatron's averaging."""
        real = [i for i in mb.indices if i >= 0]
        metrics: dict[str, Any] = {}
        if not real:
            share = logits.sum() * 0.0  # filler micro-batch: zero gradient, but a graph to backprop
        else:
            logprobs, entropy = self._outputs(mb, logits, with_entropy, entropy_grad)
            kwargs = {"entropy": entropy} if with_entropy else {}
            result = loss_fn(logprobs, [data[i] for i in real], **kwargs)
            share, metrics = result if isinstance(result, tuple) else (result, {})
        reported = {"loss": share.detach(), **{k: torch.as_tensor(v).detach() for k, v in metrics.items()}}
        # Megatron divides by num_microbatches and DDP averages over DP: undo both.
        return share * (num_mb * dp_scale), reported
