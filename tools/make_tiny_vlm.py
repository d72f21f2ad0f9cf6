"""Write a tiny, randomly initialised Hugging Face vision-language checkpoint with its processor.

The checkpoint is a real family's ``*ForConditionalGeneration`` (Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE or Qwen3.5) with a
two-block vision tower and a two-layer language model (Qwen3-VL-MoE: three of each, for its three deepstack features
as published; its experts stacked in the published layout, which SGLang reads), a locally trained BPE tokenizer
carrying the family's vision special tokens, an image processor sized so one image is a handful of tokens, and a chat
template that renders image content parts as the Qwen templates do (``<|vision_start|><|image_pad|><|vision_end|>``,
the processor then expands the pad to one token per merged patch). ``AutoProcessor.from_pretrained(out)`` and
``AutoModelForImageTextToText`` load it.

Example: python tools/make_tiny_vlm.py --out /tmp/tiny-qwen2_5_vl --family qwen2_5_vl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable for tools.make_tiny_model
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.make_tiny_model import add_lm_arguments, train_tokenizer, write_tokenizer_and_record  # noqa: E402

FAMILIES = ("qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5")

VISION_TOKENS = [
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# The Qwen-VL chat template without the default system prompt: string content as is; list content renders each part,
# an image part (type "image", or an "image"/"image_url" key) as the vision block, a text part as its text.
VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Patch size per family: Qwen2.5-VL uses 14-pixel patches, Qwen3-VL(-MoE) and Qwen3.5 16-pixel ones.
_PATCH = {"qwen2_5_vl": 14, "qwen3_vl": 16, "qwen3_vl_moe": 16, "qwen3_5": 16}
# Layers (and vision blocks) where the tool's defaults differ: SGLang's Qwen3-VL-MoE adds three deepstack features
# (range(3), as the published models' deepstack_visual_indexes [8, 16, 24]), so it needs three blocks and layers.
_DEPTH = {"qwen3_vl_moe": 3}


def vl_tokenizer(vocab_size: int, seed: int):
    """The tiny BPE tokenizer of tools/make_tiny_model.py plus the family's vision special tokens."""
    tokenizer = train_tokenizer(vocab_size, seed)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|endoftext|>", "<|im_start|>", *VISION_TOKENS]})
    tokenizer.chat_template = VL_CHAT_TEMPLATE
    return tokenizer


def _token_ids(tokenizer) -> dict[str, int]:
    ids = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in ["<|im_end|>", "<|pad|>", *VISION_TOKENS]}
    return {
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|pad|>"],
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
    }


def build_config(family: str, vocab_size: int, args: argparse.Namespace, ids: dict[str, int]):
    """The transformers config of one VL family: a tiny vision tower and a tiny language model."""
    import transformers

    head_dim = args.hidden_size // args.num_heads
    vision = dict(
        depth=args.vision_depth,
        hidden_size=args.vision_hidden_size,
        intermediate_size=2 * args.vision_hidden_size,
        num_heads=args.vision_num_heads,
        in_channels=3,
        patch_size=_PATCH[family],
        spatial_merge_size=args.spatial_merge_size,
        temporal_patch_size=2,
        out_hidden_size=args.hidden_size,
    )
    text = dict(
        vocab_size=vocab_size,
        hidden_size=args.hidden_size,
        intermediate_size=args.ffn_hidden_size,
        num_hidden_layers=args.num_layers,
        num_attention_heads=args.num_heads,
        num_key_value_heads=args.num_kv_heads,
        max_position_embeddings=args.max_position_embeddings,
        rms_norm_eps=1e-6,
        eos_token_id=ids["eos_token_id"],
        pad_token_id=ids["pad_token_id"],
        bos_token_id=ids["eos_token_id"],
        tie_word_embeddings=args.tie_word_embeddings,
    )
    # M-RoPE splits the rotary half-dimension into (temporal, height, width) sections.
    half = head_dim // 2
    token_ids = {k: v for k, v in ids.items() if k not in ("eos_token_id", "pad_token_id")}
    if family == "qwen2_5_vl":
        sections = [half - 2 * (half * 3 // 8), half * 3 // 8, half * 3 // 8]  # 16:24:24 as in the real models
        vision.update(window_size=4 * _PATCH[family] * args.spatial_merge_size, fullatt_block_indexes=[1])
        vision["hidden_act"] = "silu"
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": sections}
        return transformers.Qwen2_5_VLConfig(
            text_config=text,
            vision_config=vision,
            tie_word_embeddings=args.tie_word_embeddings,
            **token_ids,
        )
    if family in ("qwen3_vl", "qwen3_vl_moe"):
        sections = [half - 2 * (half // 4), half // 4, half // 4]  # 24:20:20 interleaved in the real models
        deepstack = [0] if family == "qwen3_vl" else list(range(3))
        vision.update(num_position_embeddings=64, deepstack_visual_indexes=deepstack)
        text.update(head_dim=head_dim)
        text["rope_parameters"] = {
            "rope_type": "default",
            "rope_theta": 5000000.0,
            "mrope_section": sections,
            "mrope_interleaved": True,
        }
        cls = transformers.Qwen3VLConfig
        if family == "qwen3_vl_moe":  # every layer MoE, normalised top-k, as Qwen3-VL-30B-A3B's config
            cls = transformers.Qwen3VLMoeConfig
            text.update(num_experts=args.num_experts, num_experts_per_tok=args.moe_top_k,
                        moe_intermediate_size=args.ffn_hidden_size, decoder_sparse_step=1, mlp_only_layers=[],
                        norm_topk_prob=True)  # fmt: skip
        return cls(text_config=text, vision_config=vision, tie_word_embeddings=args.tie_word_embeddings, **token_ids)
    if family == "qwen3_5":
        rotary = head_dim // 4  # partial_rotary_factor 0.25
        sections = [rotary // 2 - 2 * (rotary // 8), rotary // 8, rotary // 8]
        vision.update(num_position_embeddings=64)
        text.update(
            head_dim=head_dim,
            linear_key_head_dim=head_dim,
            linear_value_head_dim=head_dim,
            linear_num_key_heads=args.num_kv_heads,
            linear_num_value_heads=2 * args.num_kv_heads,
            layer_types=["linear_attention", "full_attention"] * (args.num_layers // 2)
            + ["linear_attention"] * (args.num_layers % 2),
        )
        text["rope_parameters"] = {
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": sections,
            "mrope_interleaved": True,
        }
        return transformers.Qwen3_5Config(
            text_config=text, vision_config=vision, tie_word_embeddings=args.tie_word_embeddings, **token_ids
        )
    raise ValueError(f"--family must be one of {FAMILIES}, got {family!r}")


def build_processor(family: str, tokenizer, args: argparse.Namespace):
    """The family's processor: its image processor sized by --min-pixels/--max-pixels, the tokenizer, the template."""
    import transformers

    patch = _PATCH[family]
    image_kwargs = dict(
        patch_size=patch,
        merge_size=args.spatial_merge_size,
        temporal_patch_size=2,
        min_pixels=args.min_pixels,
        max_pixels=args.max_pixels,
    )
    image_processor = transformers.Qwen2VLImageProcessor(**image_kwargs)
    if family == "qwen2_5_vl":
        video = transformers.Qwen2VLVideoProcessor(**image_kwargs)
        cls = transformers.Qwen2_5_VLProcessor
    else:
        video = transformers.Qwen3VLVideoProcessor(
            patch_size=patch, merge_size=args.spatial_merge_size, temporal_patch_size=2
        )
        cls = transformers.Qwen3VLProcessor
    return cls(
        image_processor=image_processor, tokenizer=tokenizer, video_processor=video, chat_template=VL_CHAT_TEMPLATE
    )


def make_tiny_vlm(args: argparse.Namespace) -> Path:
    """Write config, random weights, processor (tokenizer + image processor + chat template), generation config."""
    import torch
    import transformers

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = vl_tokenizer(args.vocab_size, args.seed)
    ids = _token_ids(tokenizer)
    config = build_config(args.family, len(tokenizer), args, ids)
    torch.manual_seed(args.seed)
    model = transformers.AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    if args.family == "qwen3_vl_moe":
        publish_stacked_experts(out)
    if args.family == "qwen3_5":  # the published text_config field SGLang reads (transformers keeps layer_types)
        saved = json.loads((out / "config.json").read_text())
        saved["text_config"]["full_attention_interval"] = 2
        (out / "config.json").write_text(json.dumps(saved, indent=2))
    processor = build_processor(args.family, tokenizer, args)
    processor.save_pretrained(out)
    # The tokenizer keeps its own copy of the chat template, for text-only readers.
    write_tokenizer_and_record(out, tokenizer, ids["eos_token_id"], ids["pad_token_id"], args)
    return out


def publish_stacked_experts(out: Path) -> None:
    """Rewrite a Qwen3-VL-MoE checkpoint's stacked experts in the published layout ([experts, hidden, 2 x inter],
    [experts, inter, hidden]): transformers 5 saves their transposes, which SGLang's loader misreads (it transposes
    every expert); transformers loads either by shape."""
    from safetensors.torch import load_file, save_file

    for path in sorted(out.glob("*.safetensors")):
        tensors = load_file(path)
        stacked = [n for n in tensors if n.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj"))]
        for name in stacked:
            tensors[name] = tensors[name].transpose(1, 2).contiguous()
        if stacked:
            save_file(tensors, path, metadata={"format": "pt"})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the tool."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output directory (created)")
    p.add_argument("--family", default="qwen2_5_vl", choices=FAMILIES)
    add_lm_arguments(p, 4096, "qwen3_vl_moe", None, "language model layers (default: 2, Qwen3-VL-MoE 3)")
    p.add_argument("--vision-depth", type=int, default=None, help="vision blocks (default: 2, Qwen3-VL-MoE 3)")
    p.add_argument("--vision-hidden-size", type=int, default=32)
    p.add_argument("--vision-num-heads", type=int, default=2)
    p.add_argument("--spatial-merge-size", type=int, default=2)
    p.add_argument(
        "--min-pixels", type=int, default=None, help="image processor's lower bound (default: 2x2 merged patches)"
    )
    p.add_argument(
        "--max-pixels", type=int, default=None, help="image processor's upper bound (default: 4x4 merged patches)"
    )
    args = p.parse_args(argv)
    args.vision_depth = args.vision_depth or _DEPTH.get(args.family, 2)
    args.num_layers = args.num_layers or _DEPTH.get(args.family, 2)
    factor = _PATCH[args.family] * args.spatial_merge_size
    args.min_pixels = args.min_pixels or (2 * factor) ** 2
    args.max_pixels = args.max_pixels or (4 * factor) ** 2
    return args


if __name__ == "__main__":
    print(make_tiny_vlm(parse_args()))
