"""Multi-token prediction (MTP) training: slime's `--enable-mtp-training` with `--mtp-num-layers` and
`--mtp-loss-scaling-factor` (DeepSeek-V3 technical report, arXiv:2412.19437, section 2.2; MiMo, arXiv:2505.07608).

With the flag the Megatron model gets megatron-core's MultiTokenPredictionBlock (`mtp_num_layers` layers built
from the last decoder layer's spec), loaded from and exported to the HF checkpoint's MTP tensors (their names:
families.mtp_rules): MiMo's model.mtp_layers.{i}, or the DeepSeek layout's model.layers.{num_hidden_layers + i}
(GLM-4.7-Flash, GLM-4.5, DeepSeek-V3, Kimi-K2: an MLA or GQA attention and an MoE MLP, as SGLang's deepseek_nextn
builds it). Under routing replay the MTP layers' routers pick their own experts (_route_mtp_layers_freely). MTP layer d (1-based) at position j reads the main model's last hidden state (or layer d-1's
output) at j and the embedding of token j+d, and predicts token j+1+d through the shared output layer.

The loss follows slime (its patched megatron-core GPTModel): in a training forward the MTP block runs on the main
hidden states and token embeddings *detached*, and its logits use a detached output weight, so the MTP loss trains
the MTP layers only (the draft model SGLang uses for speculative decoding) and the policy gradient is unchanged.
Per depth d the loss is the mean cross-entropy over the tokens the policy loss counts (response tokens with
loss mask 1) whose d-th-next prediction exists; the step's objective is the policy loss plus
`mtp_loss_scaling_factor / mtp_num_layers * sum_d loss_d`. Logged (unscaled) as slime names them: `mtp_{d}_loss`
and their sum `mtp_loss`.

Differences from slime, on purpose: the mean is over the step's tokens (every token weighs the same) where
Megatron averages per micro-batch means; they agree when a step is one micro-batch on one DP rank. slime's
patched Megatron rolls its loss mask once more than its labels (the target token j+1+d is counted by the mask
of token j+2+d); here each target is counted by its own mask.

Parallel layouts: with pipeline parallel the MTP block is built on the last stage only, as Megatron-LM places it
(megatron-core's get_gpt_mtp_block_spec builds none elsewhere); that stage also holds a copy of the word embedding,
loaded from the checkpoint like the first stage's and kept equal to it by finalize_model_grads, and its MTP layers
load and export under their own numbers (mtp.layers.{i}) from there. The MTP loss is computed on the last stage and
joins the loss its backward starts from; the hidden states it reads are detached, so nothing flows back to earlier
stages. With context parallel each rank holds its zig-zag share of every sequence (context_parallel.py):
megatron-core rolls the token ids over the CP ranks (roll_tensor with cp_group and packed_seq_params), and the
targets and weights here are the full row's at this rank's positions, so each rank's loss is its positions' part
and the CP ranks' gradients add up to the whole loss's; the logged losses are summed over the CP group.

The MTP loss is computed here rather than by passing `labels` to GPTModel.forward: megatron-core then
returns the main cross-entropy instead of logits, and its label roll ignores sequence ends in the packed layout
of the CPU path (one row, block-diagonal mask, no cu_seqlens). Targets past a sequence's end get weight 0.
"""

from __future__ import annotations

import re
import types
from collections.abc import Sequence
from typing import Any

import torch

from buffer.train_data import TrainData
from slime_like.core.hf_config import hf_field
from slime_like.trainer.megatron import hf_weights
from slime_like.trainer.megatron.flags import MTP_TRAINED_FAMILIES


def trained_hf_name_pattern(rules: dict[str, Any], num_layers: int) -> re.Pattern[str]:
    """The HF names the built MTP layers export, by the family's name map (families.rules_for): what is no longer
    copied unchanged from the checkpoint."""
    alternatives = []
    for key, rule in rules.items():
        if not key.startswith("mtp.layers."):
            continue
        for layer in range(num_layers):
            for name in rule.hf:
                text = re.escape(name.replace("{layer}", str(layer + rule.layer_offset)))
                alternatives.append(text.replace(re.escape("{expert}"), r"\d+"))
    return re.compile("|".join(alternatives) or "(?!)")


def enable_mtp(bridge: Any, num_layers: int, scaling_factor: float) -> None:
    """Have the bridge build `num_layers` MTP layers (after make_bridge, before build_model); a ValueError naming
    the cause where this family, checkpoint or parallel layout cannot have them."""
    from megatron.core import parallel_state as mpu

    hf = bridge.hf_config
    if hf.model_type not in MTP_TRAINED_FAMILIES:
        raise ValueError(
            f"--enable-mtp-training: MTP layers are built and trained for {', '.join(MTP_TRAINED_FAMILIES)} only, not "
            f"model_type {hf.model_type!r} (drop the flag: the checkpoint's MTP layers are then passed through)"
        )
    stored = stored_mtp_layers(hf)
    if stored != num_layers:
        raise ValueError(
            f"--mtp-num-layers {num_layers}: the checkpoint has {stored} MTP layer(s) (num_nextn_predict_layers); "
            f"use --mtp-num-layers {stored}"
        )
    if not hf_weights.untrained_hf_names(hf_weights.HFCheckpoint(bridge.slime_like_hf_dir).names(), hf):
        raise ValueError(
            f"--enable-mtp-training: the checkpoint's config declares {stored} MTP layer(s) but its safetensors hold "
            f"none (no model.layers.{hf.num_hidden_layers}.* tensors: transformers' save_pretrained drops them); "
            "convert from a checkpoint that keeps its MTP layers, or drop --enable-mtp-training"
        )
    if mpu.get_virtual_pipeline_model_parallel_world_size() is not None:
        raise ValueError(
            "--enable-mtp-training with a virtual pipeline (VPP): the engine builds MTP layers on the last pipeline "
            "stage without virtual stages only; drop VPP, or drop --enable-mtp-training (the MTP layers then pass "
            "through unchanged)"
        )
    bridge.set_extra_args(mtp_num_layers=num_layers, mtp_loss_scaling_factor=scaling_factor)
    gptmodel_args = bridge._get_gptmodel_args

    def with_mtp_block() -> dict:
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec

        args = gptmodel_args()
        decoder_spec = bridge._get_transformer_layer_spec(None)  # the MTP layer copies the last decoder layer's spec
        transformer_engine = not bridge.slime_like_local_spec
        args["mtp_block_spec"] = get_gpt_mtp_block_spec(bridge.config, decoder_spec, transformer_engine)
        return args

    bridge._get_gptmodel_args = with_mtp_block
    from mbridge.models import DeepseekV3Bridge

    if isinstance(bridge, DeepseekV3Bridge):
        _check_deepseek_mtp_layer(bridge)
        bridge._model_provider = types.MethodType(_provider_with_own_mtp_block, bridge)
    bridge.slime_like_mtp_layers = num_layers


def _check_deepseek_mtp_layer(bridge: Any) -> None:
    """The DeepSeek layout's MTP layer is an MoE layer (SGLang's deepseek_nextn builds it sparse); megatron-core builds
    it from the last decoder layer's spec, so that layer must be MoE too."""
    freq = bridge.config.moe_layer_freq
    last_is_moe = freq[-1] if isinstance(freq, list) else (bridge.config.num_layers - 1) % freq == 0
    if not bridge.config.num_moe_experts or not last_is_moe:
        raise ValueError(
            "--enable-mtp-training: the checkpoint's MTP layer is an MoE layer, but its last decoder layer is dense "
            "and megatron-core builds MTP layers from the last decoder layer's spec; drop the flag (the MTP layers "
            "are then passed through unchanged)"
        )


def _provider_with_own_mtp_block(self, post_model_creation_callbacks: list) -> Any:
    """mbridge's DeepseekV3Bridge provider, less its own MTP block (always Transformer Engine's spec, which the local
    spec of a CPU run cannot use): the block comes from _get_gptmodel_args (enable_mtp's with_mtp_block)."""
    from megatron.core.models.gpt import GPTModel

    def provider(pre_process: bool, post_process: bool, vp_stage: int | None = None) -> GPTModel:
        spec = self._get_transformer_layer_spec(vp_stage)
        args = self._get_gptmodel_args()
        if vp_stage is not None and getattr(self, "has_vp_stage", False):
            args["vp_stage"] = vp_stage
        tie = getattr(self.hf_config, "tie_word_embeddings", False)
        model = GPTModel(
            config=self.config,
            transformer_layer_spec=spec,
            pre_process=pre_process,
            post_process=post_process,
            share_embeddings_and_output_weights=tie,
            **args,
        )
        for callback in post_model_creation_callbacks:
            callback(model, pre_process=pre_process, post_process=post_process, config=self.config,
                     hf_config=self.hf_config)  # fmt: skip
        return model

    return provider


def stored_mtp_layers(hf_config: Any) -> int:
    """The number of MTP layers an HF config declares (0 when none)."""
    return int(hf_field(hf_config, "mtp_num_layers", 0))


def _unwrap(module: torch.nn.Module) -> torch.nn.Module:
    while hasattr(module, "module"):  # DDP, Float16Module
        module = module.module
    return module


def _postprocess(
    self,
    hidden_states: torch.Tensor,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    labels: torch.Tensor | None,
    rotary_pos_emb: torch.Tensor | None,
    rotary_pos_cos: torch.Tensor | None,
    rotary_pos_sin: torch.Tensor | None,
    mtp_in_postprocess: bool | None = None,
    loss_mask: torch.Tensor | None = None,
    decoder_input: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    inference_params: Any = None,
    packed_seq_params: Any = None,
    sequence_len_offset: torch.Tensor | None = None,
    runtime_gather_output: bool | None = None,
    extra_block_kwargs: dict | None = None,
    inference_context: Any = None,
) -> torch.Tensor:
    """GPTModel._postprocess of a model with MTP layers: the main logits [b, s, v]; in a training forward with
    targets set (MTPTraining.set_targets) also the MTP losses, kept on the model for the loss function."""
    from slime_like.trainer.megatron.logprobs import logprobs_and_entropy

    if labels is not None or inference_context is not None:
        raise ValueError("the engine's MTP model computes no loss from labels and runs no inference context")
    if not self.post_process:  # an earlier pipeline stage: its hidden states go on to the next (MTP is on the last)
        return hidden_states
    output_weight = self.shared_embedding_or_output_weight() if self.share_embeddings_and_output_weights else None
    targets = self.slime_like_mtp_targets
    if mtp_in_postprocess and targets is not None:
        embedding = self.embedding

        def frozen_embedding(input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():  # slime: the MTP loss does not train the shared embedding
                return embedding(input_ids=input_ids, position_ids=position_ids)

        stacked = self.mtp(
            input_ids=input_ids,
            position_ids=position_ids,
            hidden_states=hidden_states.detach(),  # nor the main model
            attention_mask=attention_mask,
            rotary_pos_emb=rotary_pos_emb,
            rotary_pos_cos=rotary_pos_cos,
            rotary_pos_sin=rotary_pos_sin,
            packed_seq_params=packed_seq_params,
            sequence_len_offset=sequence_len_offset,
            embedding=frozen_embedding,
            extra_block_kwargs=extra_block_kwargs,
        )
        depths = torch.chunk(stacked, 1 + self.config.mtp_num_layers, dim=0)[1:]
        head = (output_weight if output_weight is not None else self.output_layer.weight).detach()  # nor the head
        labels_by_depth, weights_by_depth = targets
        losses = []
        for hidden, depth_labels, weights in zip(depths, labels_by_depth, weights_by_depth, strict=True):
            logits, _ = self.output_layer(hidden, weight=head, runtime_gather_output=runtime_gather_output)
            logprobs, _ = logprobs_and_entropy(logits.transpose(0, 1), depth_labels, with_entropy=False)
            losses.append(-(logprobs * weights).sum())
        self.slime_like_mtp_losses = losses
    logits, _ = self.output_layer(hidden_states, weight=output_weight, runtime_gather_output=runtime_gather_output)
    return logits.transpose(0, 1).contiguous()


def _route_mtp_layers_freely(gpt: torch.nn.Module) -> None:
    """Take the MTP layers' routers out of routing replay (routing_replay.py): they always pick their own experts.

    SGLang records the routing of the main layers only (its routed-experts capture spans num_hidden_layers and
    leaves the draft model's layers out), the policy's log-probs never pass through an MTP layer, and the MTP
    block runs in training forwards only, so an old-policy forward has nothing to record for it either."""
    from megatron.core.transformer.moe.router import TopKRouter
    from megatron.core.transformer.moe.router_replay import RouterReplay

    mtp = getattr(gpt, "mtp", None)
    for module in mtp.modules() if mtp is not None else ():
        if isinstance(module, TopKRouter) and module.router_replay is not None:
            RouterReplay.global_router_replay_instances.remove(module.router_replay)
            module.router_replay = None


class MTPTraining:
    """The MTP layers of one engine's model: a step's loss masks in, each micro-batch's MTP loss out."""

    def __init__(self, model: Sequence[torch.nn.Module], num_layers: int, scaling_factor: float) -> None:
        self.num_layers = num_layers
        self.scale = scaling_factor / num_layers  # Megatron's per-layer weight of the MTP loss
        self.masks: list[torch.Tensor] | None = None
        self.counts: list[float] = []
        for chunk in model:
            gpt = _unwrap(chunk)
            gpt.slime_like_mtp_targets = None
            gpt.slime_like_mtp_losses = None
            gpt._postprocess = types.MethodType(_postprocess, gpt)
            _route_mtp_layers_freely(gpt)

    def begin_step(self, lengths: Sequence[int], masks: Sequence[torch.Tensor], dp_sum: bool = False) -> None:
        """The step's loss masks, per sequence aligned with its log-probs (entry i counts token i+1); dp_sum: each
        DP rank holds its share of the step, so the token counts are summed over DP ranks."""
        if len(masks) != len(lengths):
            raise ValueError(f"MTP training needs one loss mask per sequence: {len(masks)} for {len(lengths)}")
        self.masks = []
        for length, mask in zip(lengths, masks, strict=True):
            mask = torch.as_tensor(mask, dtype=torch.float32).flatten()
            if len(mask) != length - 1:
                raise ValueError(f"an MTP loss mask has {len(mask)} entries for a sequence of {length} tokens")
            self.masks.append(mask)
        # Depth d predicts token i+1 (mask entry i) from position i-d: entries i < d have no such prediction.
        depths = range(1, self.num_layers + 1)
        counts = torch.tensor([sum(float(m[d:].sum()) for m in self.masks) for d in depths], dtype=torch.float64)
        if dp_sum:
            from megatron.core import parallel_state as mpu

            if mpu.get_data_parallel_world_size() > 1:
                device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
                counts = counts.to(device)
                torch.distributed.all_reduce(counts, group=mpu.get_data_parallel_group())
        self.counts = [max(1.0, float(c)) for c in counts]

    @staticmethod
    def loss_masks(batch: TrainData) -> list[torch.Tensor]:
        """Per sequence the tokens the MTP loss counts, aligned with its log-probs: the response tokens the policy
        loss counts (its loss mask), never the prompt."""
        return [
            torch.cat([torch.zeros(len(tokens) - 1 - len(mask)), mask])
            for tokens, mask in zip(batch.tokens, batch.masks(), strict=True)
        ]

    def end_step(self) -> None:
        """Forget the step's masks."""
        self.masks = None

    @staticmethod
    def on(model: torch.nn.Module) -> bool:
        """Whether this model chunk holds the MTP block (the last pipeline stage's)."""
        return bool(getattr(_unwrap(model), "mtp_process", False))

    def set_targets(self, model: torch.nn.Module, mb: Any, device: torch.device, shard: Any = None) -> None:
        """Before a training forward: each depth's target tokens and loss weights for this micro-batch (shard: this
        CP rank's part of it, context_parallel.CPShard; None without context parallel)."""
        assert self.masks is not None, "begin_step first"
        labels = torch.zeros((self.num_layers, *mb.tokens.shape), dtype=torch.long)
        weights = torch.zeros((self.num_layers, *mb.tokens.shape), dtype=torch.float32)
        for index, row, start, length in zip(mb.indices, mb.rows, mb.starts, mb.lengths, strict=True):
            if index < 0:
                continue
            tokens, mask = mb.tokens[row, start : start + length], self.masks[index]
            for d in range(1, self.num_layers + 1):
                n = length - 1 - d  # positions j whose target token j+1+d is in the sequence
                if n <= 0:
                    continue
                labels[d - 1, row, start : start + n] = tokens[1 + d :]
                weights[d - 1, row, start : start + n] = mask[d:] / self.counts[d - 1]
        if shard is not None:  # targets from the full row, at the positions this CP rank holds
            labels, weights = labels[..., shard.positions], weights[..., shard.positions]
        gpt = _unwrap(model)
        gpt.slime_like_mtp_targets = (labels.to(device), weights.to(device))

    def take_loss(self, model: torch.nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """After a training forward: this micro-batch's share of the scaled MTP loss and its unscaled metrics."""
        from megatron.core import parallel_state as mpu

        gpt = _unwrap(model)
        losses, gpt.slime_like_mtp_losses, gpt.slime_like_mtp_targets = gpt.slime_like_mtp_losses, None, None
        assert losses is not None, "the forward ran without MTP targets"
        logged = torch.stack([loss.detach() for loss in losses])
        if mpu.get_context_parallel_world_size() > 1:  # each CP rank's loss is its positions' part
            torch.distributed.all_reduce(logged, group=mpu.get_context_parallel_group())
        metrics = {f"mtp_{d + 1}_loss": loss for d, loss in enumerate(logged)}
        metrics["mtp_loss"] = logged.sum()
        return self.scale * sum(losses), metrics
