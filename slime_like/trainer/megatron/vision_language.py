"""Vision-language models: Megatron's language model beside the transformers vision tower (slime's design).

A VL family's model chunk is a GPTModel subclass (VisionLanguageGPTModel) holding, on the first pipeline stage, the
Hugging Face vision module built from the checkpoint's vision_config under the name the checkpoint stores it
(`visual.*` for Qwen2.5-VL, `model.visual.*` for Qwen3-VL and Qwen3.5 / 3.6), so loading, export, checkpoints and
weight sync use the HF names as they are (families.py maps them as plain copies). The language model keeps GPTModel's
names (Qwen2's layers for Qwen2.5-VL, Qwen3's for Qwen3-VL, bridges.Qwen3_5Bridge's hybrid layers for Qwen3.5).

Forward of one micro-batch: the vision tower turns the micro-batch's `pixel_values` / `image_grid_thw` (the
processor's tensors of its sequences, concatenated in sequence order: micro_batch_inputs) into image embeddings,
scattered into the word embeddings at the image-pad tokens (row-major order = sequence order), then GPTModel runs
with `decoder_input` and the 3-D multimodal rope (position_embedding_type "mrope"; Qwen3-VL and Qwen3.5 interleave
the T/H/W frequencies: InterleavedMultimodalRotaryEmbedding): positions per sequence from its token ids and image grids
(mrope_positions, transformers' get_rope_index), sequences found in a packed row where their 1-D positions restart at 0.

Parallelism: the tower is replicated on every TP rank (its inputs and the gradient reaching its output are the same
there, so its gradients are too), its parameters are ordinary DDP parameters (reduced over DP with the LM's, in the
optimizer with them), and Megatron counts them once in the grad norm (not tensor-parallel). Freeze it with slime's
`--freeze-params-name-list visual`; a run without --multimodal-keys freezes it (freeze_tower). Not built: videos,
context parallel. Qwen3-VL's (and Qwen3-VL-MoE's: qwen3_vl_moe.py) deepstack features (added after the first layers
by forward hooks) need those layers on the first pipeline stage and no sequence parallel or full recompute.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
from mbridge.models.qwen2 import Qwen2Bridge
from mbridge.models.qwen3 import Qwen3Bridge
from megatron.core.models.common.embeddings.rotary_pos_embedding import MultimodalRotaryEmbedding
from megatron.core.models.gpt import GPTModel

from slime_like.core.hf_config import hf_field, text_config
from slime_like.trainer.megatron.bridges import Qwen3_5Bridge, fix_hf_config, rope_parameters
from slime_like.trainer.megatron.families import VISION_BUILT
from slime_like.trainer.megatron.fused_ops import compiled_rope_installed

# The processor's tensors the trainer feeds the model (slime's Sample.multimodal_train_inputs); other keys (e.g.
# mm_token_type_ids) are not needed: positions come from the token ids.
IMAGE_KEYS = ("pixel_values", "image_grid_thw")
VIDEO_KEYS = ("pixel_values_videos", "video_grid_thw")


# model_type -> (transformers module, vision class, where the checkpoint stores the tower: the Megatron name too).
TOWERS = {
    "qwen2_5_vl": ("qwen2_5_vl.modeling_qwen2_5_vl", "Qwen2_5_VisionTransformerPretrainedModel", "visual"),
    "qwen3_vl": ("qwen3_vl.modeling_qwen3_vl", "Qwen3VLVisionModel", "model.visual"),
    "qwen3_vl_moe": ("qwen3_vl_moe.modeling_qwen3_vl_moe", "Qwen3VLMoeVisionModel", "model.visual"),
    "qwen3_5": ("qwen3_5.modeling_qwen3_5", "Qwen3_5VisionModel", "model.visual"),
    "qwen3_5_moe": ("qwen3_5_moe.modeling_qwen3_5_moe", "Qwen3_5MoeVisionModel", "model.visual"),
}


def _vision_tower(vl_config: Any, dtype: torch.dtype) -> torch.nn.Module:
    """The transformers vision module of a VL config (random init; the checkpoint's weights are loaded after)."""
    import importlib

    module, name, _ = TOWERS[vl_config.model_type]
    tower_class = getattr(importlib.import_module(f"transformers.models.{module}"), name)
    tower = tower_class._from_config(vl_config.vision_config)
    tower.to(dtype=dtype)
    for param in tower.parameters():  # replicated over TP (Megatron's default attributes say so explicitly)
        param.tensor_model_parallel = False
        param.partition_dim = -1
        param.partition_stride = 1
    return tower


def image_token_mask(input_ids: torch.Tensor, image_token_id: int, vision_start_id: int) -> torch.Tensor:
    """Which tokens of [rows, T] ids hold an image: the image-pad runs right after a vision-start token.

    A pad the policy sampled elsewhere (a tiny or early model does) is text, as SGLang serves it and as transformers
    reads it (mm_token_type_ids 0, get_rope_index's vision-start scan): its word embedding, 1-D positions, any loss.
    """
    is_pad = input_ids == image_token_id
    if not bool(is_pad.any()):
        return is_pad
    before = torch.zeros_like(input_ids)
    before[..., 1:] = input_ids[..., :-1]
    run_start = is_pad & (before != image_token_id)
    run_start[..., 0] = is_pad[..., 0]
    run_id = torch.cumsum(run_start.flatten().long(), 0).view_as(input_ids)  # one id per pad run, over all rows
    image_runs = run_id[run_start & (before == vision_start_id)]
    return is_pad & torch.isin(run_id, image_runs)


def mrope_positions(
    is_image: torch.Tensor,
    position_ids: torch.Tensor,
    image_grid_thw: torch.Tensor | None,
    spatial_merge_size: int,
) -> torch.Tensor:
    """Qwen2.5-VL's [3, rows, T] rope positions (temporal, height, width) of a micro-batch's token rows.

    `is_image` marks the image tokens (image_token_mask). Each sequence (a run of `position_ids` starting at 0)
    counts its own positions: text tokens advance all three by one; an image's tokens (t x h x w merged patches,
    grids consumed in row-major order) take start + (t, h, w) indices and the text after it starts at
    start + max(h, w), as transformers' get_rope_index does.
    """
    rows, width = is_image.shape
    out = torch.zeros(3, rows, width, dtype=torch.long)
    images = is_image.cpu()
    grids = iter([] if image_grid_thw is None else image_grid_thw.cpu().tolist())
    starts = position_ids.cpu() == 0
    for row in range(rows):
        if not bool(images[row].any()):  # text only: the 1-D positions on all three axes
            out[:, row] = position_ids[row].cpu()
            continue
        image = images[row].tolist()
        row_starts = starts[row].tolist()
        current, i = 0, 0
        while i < width:
            if row_starts[i]:
                current = 0
            if not image[i]:
                j = i + 1  # a text run: to the next image token or sequence start
                while j < width and not image[j] and not row_starts[j]:
                    j += 1
                out[:, row, i:j] = torch.arange(current, current + j - i)
                current += j - i
                i = j
                continue
            grid = next(grids, None)
            if grid is None:
                raise ValueError(
                    "the micro-batch has more image tokens than its image_grid_thw describes: each sample's "
                    "multimodal_train_inputs must be the processor's tensors of the images its tokens hold"
                )
            t, h, w = grid[0], grid[1] // spatial_merge_size, grid[2] // spatial_merge_size
            count = t * h * w
            if i + count > width or not all(image[i : i + count]):
                raise ValueError(
                    f"an image of grid {grid} needs {count} consecutive image tokens at position {i}: the prompt's "
                    "image tokens do not match the sample's image_grid_thw"
                )
            out[0, row, i : i + count] = torch.arange(t).repeat_interleave(h * w) + current
            out[1, row, i : i + count] = torch.arange(h).repeat_interleave(w).repeat(t) + current
            out[2, row, i : i + count] = torch.arange(w).repeat(h * t) + current
            current += max(grid[1], grid[2]) // spatial_merge_size
            i += count
    if next(grids, None) is not None:
        raise ValueError("the micro-batch's image_grid_thw describes more images than its tokens hold")
    return out.to(is_image.device)


class InterleavedMultimodalRotaryEmbedding(MultimodalRotaryEmbedding):
    """Qwen3.5's multimodal rope: the frequencies of temporal, height and width interleaved (T H W T H W ... T T)
    instead of Megatron's (and Qwen2.5-VL's) consecutive sections (transformers' apply_interleaved_mrope)."""

    def forward(self, position_ids: torch.Tensor, mrope_section: list[int], cp_group: Any = None) -> torch.Tensor:
        """[seq, rows, 1, 2 * dim] rope frequencies of [3, rows, seq] positions."""
        seq = position_ids.to(device=self.inv_freq.device, dtype=torch.float32)
        if self.seq_len_interpolation_factor is not None:
            seq = seq / self.seq_len_interpolation_factor
        inv_freq = self.inv_freq[None, None, :, None].expand(3, seq.shape[1], -1, 1)
        freqs = (inv_freq @ seq[:, :, None, :]).transpose(2, 3)  # [3, rows, seq, dim]
        mixed = freqs[0].clone()
        for axis in (1, 2):
            mixed[..., axis : mrope_section[axis] * 3 : 3] = freqs[axis, ..., axis : mrope_section[axis] * 3 : 3]
        return torch.cat((mixed, mixed), dim=-1)[..., None, :].transpose(0, 1).contiguous()


class VisionLanguageGPTModel(GPTModel):
    """GPTModel with a transformers vision tower whose image embeddings replace the image-pad tokens' embeddings."""

    def __init__(self, *args: Any, vl_config: Any, mrope_interleaved: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, scatter_embedding_sequence_parallel=False, **kwargs)
        self.image_token_id = int(vl_config.image_token_id)
        self.vision_start_id = int(vl_config.vision_start_token_id)
        self.spatial_merge_size = int(vl_config.vision_config.spatial_merge_size)
        if mrope_interleaved:
            old = self.rotary_pos_emb
            self.rotary_pos_emb = InterleavedMultimodalRotaryEmbedding(
                kv_channels=self.config.kv_channels,
                rotary_percent=kwargs.get("rotary_percent", 1.0),
                seq_len_interpolation_factor=kwargs.get("seq_len_interpolation_factor"),
                rotary_base=kwargs.get("rotary_base", 10000),
            )
            self.rotary_pos_emb.inv_freq = self.rotary_pos_emb.inv_freq.to(old.inv_freq.device)
        # The tower under the name the checkpoint stores it (Megatron name == HF name): visual.* or model.visual.*.
        self.tower_path = TOWERS[vl_config.model_type][2]
        tower = _vision_tower(vl_config, self.config.params_dtype) if self.pre_process else None
        if self.tower_path == "model.visual":
            self.model = torch.nn.Module()
            self.model.visual = tower
        else:
            self.visual = tower
        self._deepstack: tuple[torch.Tensor, list[torch.Tensor]] | None = None  # this forward's (mask, features)
        self._hook_deepstack(len(getattr(vl_config.vision_config, "deepstack_visual_indexes", None) or []))

    def _hook_deepstack(self, count: int) -> None:
        """Qwen3-VL: after decoder layer i < count, add the tower's i-th deepstack features at the image tokens."""
        if not count:
            return
        local = {layer.layer_number - 1: layer for layer in self.decoder.layers}
        config = self.config
        if not all(i in local for i in range(count)) and (self.pre_process or any(i in local for i in range(count))):
            raise ValueError(f"Qwen3-VL's deepstack features enter layers 0-{count - 1}: keep them on the first stage")
        if (
            config.sequence_parallel
            or config.recompute_granularity == "full"
            or config.virtual_pipeline_model_parallel_size
        ):
            raise ValueError(
                "Qwen3-VL's deepstack features are added by hooks on the first layers: --sequence-parallel, "
                "--recompute-granularity full and virtual pipeline stages are not supported with them yet"
            )
        for i in range(count):
            if i in local:
                local[i].register_forward_hook(partial(self._add_deepstack, i))

    def _add_deepstack(self, index: int, module: torch.nn.Module, inputs: Any, output: Any) -> Any:
        """Forward hook of decoder layer `index`: its output plus the deepstack features at the image tokens."""
        if self._deepstack is None:
            return output
        mask, features = self._deepstack
        hidden = output[0] if isinstance(output, tuple) else output
        added = torch.zeros_like(hidden).masked_scatter(
            mask[..., None].expand_as(hidden), features[index].to(hidden.dtype)
        )
        return (hidden + added, *output[1:]) if isinstance(output, tuple) else hidden + added

    @property
    def tower(self) -> torch.nn.Module:
        """The vision tower (first pipeline stage)."""
        return self.model.visual if self.tower_path == "model.visual" else self.visual

    def _image_embeddings(
        self,
        input_ids: torch.Tensor,
        is_image: torch.Tensor,
        pixel_values: torch.Tensor | None,
        image_grid_thw: torch.Tensor | None,
    ) -> torch.Tensor:
        """Word embeddings [T, rows, H] with the image embeddings at the image tokens."""
        embeddings = self.embedding(input_ids=input_ids, position_ids=None)
        if pixel_values is None:
            if bool(is_image.any()):
                raise ValueError(
                    "image tokens in a sequence without pixel_values: the sample's multimodal_train_inputs are "
                    "missing (the rollout must set them, slime's contract)"
                )
            return embeddings
        tower = self.tower
        out = tower(pixel_values.to(tower.dtype), grid_thw=image_grid_thw)
        images = out.pooler_output
        if getattr(out, "deepstack_features", None):  # Qwen3-VL: added after the first layers (_add_deepstack)
            self._deepstack = (is_image.transpose(0, 1), list(out.deepstack_features))
        count = int(is_image.sum())
        if count != images.shape[0]:
            raise ValueError(
                f"{count} image tokens but {images.shape[0]} image embeddings from the vision tower: the prompt's "
                "image tokens and the sample's pixel_values / image_grid_thw disagree"
            )
        mask = is_image.transpose(0, 1)[..., None].expand_as(embeddings)
        return embeddings.masked_scatter(mask, images.to(embeddings.dtype))

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        decoder_input: torch.Tensor | None = None,
        *args: Any,
        pixel_values: torch.Tensor | None = None,
        image_grid_thw: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """GPTModel's forward with the images in place and 3-D rope positions (position_ids: per-sequence 1-D)."""
        is_image = image_token_mask(input_ids, self.image_token_id, self.vision_start_id)
        rope = mrope_positions(is_image, position_ids, image_grid_thw, self.spatial_merge_size)
        if self.pre_process and decoder_input is None:
            decoder_input = self._image_embeddings(input_ids, is_image, pixel_values, image_grid_thw)
            if self.config.sequence_parallel:
                from megatron.core import tensor_parallel

                decoder_input = tensor_parallel.scatter_to_sequence_parallel_region(decoder_input)
        try:
            return super().forward(input_ids, rope, attention_mask, decoder_input, *args, **kwargs)
        finally:
            self._deepstack = None


def micro_batch_inputs(
    per_sequence: Sequence[dict[str, Any] | None] | None, indices: Sequence[int], device: torch.device
) -> dict[str, torch.Tensor]:
    """The model's image inputs of one micro-batch: its sequences' pixel_values and image_grid_thw concatenated in
    the order the sequences sit in its rows (filler -1 has none); {} when none of them has images."""
    if not per_sequence:
        return {}
    chosen = [per_sequence[i] for i in indices if i >= 0 and per_sequence[i]]
    for inputs in chosen:
        if any(inputs.get(key) is not None for key in VIDEO_KEYS):
            raise ValueError("video inputs (pixel_values_videos) are not supported by the trainer yet: images only")
        if (inputs.get("pixel_values") is None) != (inputs.get("image_grid_thw") is None):
            raise ValueError("multimodal_train_inputs need both pixel_values and image_grid_thw (the processor's)")
    chosen = [inputs for inputs in chosen if inputs.get("pixel_values") is not None]
    if not chosen:
        return {}
    return {
        key: torch.cat([torch.as_tensor(inputs[key]) for inputs in chosen]).to(device, non_blocking=True)
        for key in IMAGE_KEYS
    }


def check_text_only_loss(
    tokens: Sequence[Sequence[int]],
    response_lengths: Sequence[int],
    loss_masks: Sequence[Sequence[int]],
    image_id: int,
    vision_start_id: int,
) -> None:
    """A ValueError if a loss-masked response token holds an image (images belong to the prompt or observations)."""
    for k, (seq, length, mask) in enumerate(zip(tokens, response_lengths, loss_masks, strict=True)):
        is_image = image_token_mask(torch.tensor(seq), image_id, vision_start_id)[len(seq) - length :].tolist()
        if any(m and image for image, m in zip(is_image, mask, strict=False)):
            raise ValueError(
                f"sequence {k}: an image token is inside the loss mask: image tokens must be prompt tokens (or masked "
                "out with loss_mask 0 when a multi-turn rollout adds images between turns)"
            )


def is_vision_language(model: Sequence[torch.nn.Module], cp_size: int = 1) -> bool:
    """Whether the model chunks are a VL model (VisionLanguageGPTModel); a ValueError for one with context parallel."""
    vision = isinstance(_unwrapped(model), VisionLanguageGPTModel)
    if vision and cp_size > 1:
        raise ValueError("--context-parallel-size > 1 is not supported for vision-language models yet: use 1")
    return vision


def _mrope_config(config: Any, hf_text_config: Any, family: str) -> Any:
    """The TransformerConfig with the text config's mrope_section; RoPE fusion kept only on fused_ops' compiled RoPE
    (it takes mrope's per-token frequencies; TE's THD kernel indexes them by position in the sequence)."""
    rope = rope_parameters(hf_text_config)
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", "mrope", None):
        raise ValueError(f"rope_type {rope.get('rope_type')!r} in the HF config: {family} runs plain mrope only")
    if "mrope_section" not in rope:
        raise ValueError(f"the HF config's rope_parameters have no mrope_section: not a {family} text config")
    config.mrope_section = list(rope["mrope_section"])
    config.apply_rope_fusion = bool(config.apply_rope_fusion) and compiled_rope_installed()
    return config


class VisionLanguageBridge:
    """Mixin of a VL family's bridge: mrope GPTModel arguments and a provider of VisionLanguageGPTModel chunks.
    The bridge's hf_config is the text config; vl_config the whole."""

    vl_config: Any
    label: str  # the family's name in errors

    def __init__(self, hf_config: Any, *args: Any, **kwargs: Any) -> None:
        self.vl_config = hf_config
        super().__init__(self._text_config(hf_config), *args, **kwargs)  # type: ignore[call-arg]

    @staticmethod
    def _text_config(hf_config: Any) -> Any:
        text = text_config(hf_config)
        fix_hf_config(text)
        text.tie_word_embeddings = hf_field(hf_config, "tie_word_embeddings", False)  # the outer config's (hf_config)
        return text

    def _build_config(self) -> Any:
        return _mrope_config(super()._build_config(), self.hf_config, self.label)  # type: ignore[misc]

    def _get_gptmodel_args(self) -> dict:
        args = super()._get_gptmodel_args()  # type: ignore[misc]
        args.update(position_embedding_type="mrope", rotary_base=rope_parameters(self.hf_config)["rope_theta"])
        return args

    def _model_provider(self, post_model_creation_callbacks: list, **_: Any):
        """mbridge's GPTModel provider, building VisionLanguageGPTModel chunks (the tower on the first stage)."""
        import math

        tied = bool(getattr(self.hf_config, "tie_word_embeddings", False))
        interleaved = bool(rope_parameters(self.hf_config).get("mrope_interleaved", False))

        def provider(pre_process: bool, post_process: bool, vp_stage: int | None = None) -> GPTModel:
            spec = self._get_transformer_layer_spec(vp_stage)
            args = self._get_gptmodel_args()
            if vp_stage is not None and getattr(self, "has_vp_stage", False):
                args["vp_stage"] = vp_stage
            self.vocab_size = self.padded_vocab_size = args["vocab_size"]
            if self.make_vocab_size_divisible_by is not None:
                divisor = self.make_vocab_size_divisible_by
                self.padded_vocab_size = int(math.ceil(self.vocab_size / divisor) * divisor)
            args["vocab_size"] = self.padded_vocab_size
            model = VisionLanguageGPTModel(
                config=self.config,
                transformer_layer_spec=spec,
                pre_process=pre_process,
                post_process=post_process,
                share_embeddings_and_output_weights=tied,
                vl_config=self.vl_config,
                mrope_interleaved=interleaved,
                **args,
            )
            for callback in post_model_creation_callbacks:
                callback(
                    model,
                    pre_process=pre_process,
                    post_process=post_process,
                    config=self.config,
                    hf_config=self.hf_config,
                )
            return model

        return provider


class Qwen2_5VLBridge(VisionLanguageBridge, Qwen2Bridge):
    """Qwen2.5-VL (qwen2_5_vl): Qwen2's language model (qkv bias) from text_config with 3-D mrope, beside the
    transformers vision tower (VisionLanguageGPTModel)."""

    label = "Qwen2.5-VL"


class Qwen3VLBridge(VisionLanguageBridge, Qwen3Bridge):
    """Qwen3-VL (qwen3_vl, dense): Qwen3's language model (QK norm) from text_config with interleaved 3-D mrope, beside
    transformers' Qwen3-VL vision tower, whose deepstack features enter the first layers (VisionLanguageGPTModel)."""

    label = "Qwen3-VL"


class Qwen3_5VLBridge(VisionLanguageBridge, Qwen3_5Bridge):
    """Qwen3.5 / 3.6 with their vision tower (qwen3_5, qwen3_5_moe): Qwen3_5Bridge's hybrid text model with
    interleaved 3-D mrope on its partial rope, beside transformers' Qwen3.5 vision model (model.visual.*)."""

    label = "Qwen3.5"

    @staticmethod
    def _text_config(hf_config: Any) -> Any:
        return hf_config  # Qwen3_5Bridge reads the nested text config itself


def freeze_tower(model: torch.nn.Module, **_: Any) -> None:
    """An mbridge post-creation callback freezing the vision tower (a run without images: nothing would train it,
    and AdamW's decoupled weight decay would still shrink it)."""
    if isinstance(model, VisionLanguageGPTModel) and model.pre_process:
        model.tower.requires_grad_(False)


def _unwrapped(model: Sequence[torch.nn.Module]) -> torch.nn.Module:
    chunk = model[0]
    while hasattr(chunk, "module"):  # DDP, Float16Module
        chunk = chunk.module
    return chunk


def training_images(data: Any, model: Sequence[torch.nn.Module]) -> list[Any] | None:
    """A training batch's per-sequence images (TrainData.multimodal_train_inputs; None without any), checked to lie
    outside the loss mask."""
    images = getattr(data, "multimodal_train_inputs", None)
    if not images or not any(images):
        return None
    if getattr(data, "loss_masks", None):
        chunk = _unwrapped(model)
        check_text_only_loss(
            data.tokens, data.response_lengths, data.loss_masks, chunk.image_token_id, chunk.vision_start_id
        )
    return list(images)


def refuse_images(multimodal: Sequence[dict[str, Any] | None], hf_config: Any) -> None:
    """A ValueError when images reach a model built without a vision tower, naming what is built."""
    if any(inputs and inputs.get(key) is not None for inputs in multimodal for key in IMAGE_KEYS + VIDEO_KEYS):
        raise ValueError(
            f"image inputs reached the trainer, but this model ({getattr(hf_config, 'model_type', None)}) is built "
            "without a vision tower: the trainer's vision path is built for Qwen2.5-VL, Qwen3-VL(-MoE) and Qwen3.5 "
            f"({', '.join(VISION_BUILT)}). Train one of those, or drop --multimodal-keys to train on text"
        )
