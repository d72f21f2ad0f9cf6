"""SGLang server-side hooks for vision-language checkpoints (Qwen2.5-VL, Qwen3-VL), applied by rollout/sglang_launch.py.

1. Token in with images. A rollout sends the sequence's ids as the processor made them, each image already expanded
   to one `<|image_pad|>` per merged patch, with the images in `image_data`. SGLang 0.5.15 decodes such ids to text
   and runs the Hugging Face processor on it: transformers 5's processor expands every `<|image_pad|>` it finds
   again, one image per pad, so with more pads than images it fails ("coroutine raised StopIteration", HTTP 500);
   and where it works (one pad per image) the text is tokenised again, which changes a multi-turn sequence's
   sampled tokens (measured: a second turn's log-probs off by 0.02-0.04). The hook gives SGLang's loader a
   stand-in text instead, each image block as the chat template renders it and every other token as one special
   token, so the processor's ids line up one to one with the ids sent, image offsets included (its pixel values,
   grids and M-RoPE positions are the images'), and keeps the ids as sent: base_processor.process_mm_data_async
   reuses `base_output.input_ids` when they have the processor's length. The sequence served is exactly the
   rollout's, never re-tokenised text.

2. Without CUDA: SGLang's Qwen-VL multimodal processors (sglang/srt/multimodal/processors/qwen_vl.py) import its
   Qwen3.5 model, which at import binds three fused kernels of SGLang's CPU kernel package (`sgl_kernel::
   fused_sigmoid_mul_cpu`, `fused_qk_gemma_rmsnorm_cpu`, `fused_qk_gemma_rmsnorm_with_gate_cpu`). That package is
   built from source and not installed here, so the import fails, SGLang skips the processor module ("Ignore import
   error when loading sglang.srt.multimodal.processors.qwen_vl"), and a Qwen2.5-VL / Qwen3-VL server stops at start
   ("No processor registered for architecture: ['Qwen2_5_VLForConditionalGeneration']"). Neither of those models
   calls the kernels: they are defined here, when missing, as operators that raise if called (a Qwen3.5 server would
   reach them only after its linear-attention kernels, which are missing too: docs/models.md).
"""

from __future__ import annotations

from typing import Any

LOAD_MM_DATA = "sglang.srt.multimodal.processors.base_processor.BaseMultimodalProcessor.load_mm_data"
# SGLang's Qwen3.5 CPU kernels, bound at import of sglang/srt/models/qwen3_5.py (only ever called by Qwen3.5).
QWEN3_5_CPU_KERNELS = (
    "fused_sigmoid_mul_cpu",
    "fused_qk_gemma_rmsnorm_cpu",
    "fused_qk_gemma_rmsnorm_with_gate_cpu",
)
_LIBRARIES: list[Any] = []  # the torch.library fragments defined here (kept alive with their operators)


def stand_in_text(ids: list[int], special: dict[str, int], names: dict[int, str], filler: str) -> str:
    """The text SGLang's processor is given for `ids`: each image block (vision start, a run of image or video
    pads, vision end) as the chat template renders it (one pad: the processor expands it again), every other token
    as `filler`, a special token that tokenizes alone. Its tokens therefore line up one to one with `ids`."""
    start, end = special["start"], special["end"]
    pads = {special["image"], special["video"]}
    parts: list[str] = []
    i = 0
    while i < len(ids):
        if ids[i] == start and i + 1 < len(ids) and ids[i + 1] in pads:
            j = i + 1
            while j < len(ids) and ids[j] == ids[i + 1]:
                j += 1
            if j < len(ids) and ids[j] == end:
                parts.append(names[start] + names[ids[i + 1]] + names[end])
                i = j + 1
                continue
        parts.append(filler)
        i += 1
    return "".join(parts)


def _special_ids(processor: Any) -> dict[str, int] | None:
    """The vision special ids of SGLang's Qwen-VL processor (None for another family: the hook leaves it alone)."""
    tokens = getattr(processor, "mm_tokens", None)
    special = {
        "start": getattr(processor, "vision_start_token_id", None),
        "end": getattr(processor, "vision_end_token_id", None),
        "image": getattr(tokens, "image_token_id", None),
        "video": getattr(tokens, "video_token_id", None),
    }
    return special if all(v is not None for v in special.values()) else None


def _filler(tokenizer: Any, special: dict[str, int]) -> str | None:
    """A special token (eos, else pad) that is no vision token and tokenizes alone, however many are joined."""
    for token in (tokenizer.eos_token, tokenizer.pad_token):
        if not token or tokenizer.convert_tokens_to_ids(token) in special.values():
            continue
        if len(tokenizer.encode(token * 3, add_special_tokens=False)) == 3:
            return token
    return None


async def keep_sent_ids(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND hook of BaseMultimodalProcessor.load_mm_data: for a prompt of ids, load the images with a stand-in
    text whose tokens line up with the ids (stand_in_text), and keep the ids as sent."""
    prompt = kwargs["prompt"] if "prompt" in kwargs else (args[0] if args else None)
    special = _special_ids(self)
    tokenizer = getattr(self, "_tokenizer", None)
    if not isinstance(prompt, list) or not prompt or not isinstance(prompt[0], int) or not special or not tokenizer:
        return await original(self, *args, **kwargs)
    filler = _filler(tokenizer, special)
    if filler is None:
        return await original(self, *args, **kwargs)
    names = {i: tokenizer.convert_ids_to_tokens(i) for i in special.values()}
    text = stand_in_text(prompt, special, names, filler)
    if "prompt" in kwargs:
        kwargs["prompt"] = text
    else:
        args = (text, *args[1:])
    output = await original(self, *args, **kwargs)
    output.input_ids = list(prompt)  # reused by process_mm_data_async: the processor's ids have its length
    return output


def define_missing_cpu_kernels() -> list[str]:
    """Define the Qwen3.5 CPU kernels SGLang binds at import, as operators that raise, where they are missing;
    returns the names defined."""
    import torch

    missing = [name for name in QWEN3_5_CPU_KERNELS if not hasattr(torch.ops.sgl_kernel, name)]
    if not missing:
        return []
    lib = torch.library.Library("sgl_kernel", "FRAGMENT")
    for name in missing:
        lib.define(f"{name}(Tensor x) -> Tensor")

        def refuse(*_args: Any, _name: str = name) -> Any:
            raise NotImplementedError(
                f"sgl_kernel::{_name} is SGLang's CPU kernel of Qwen3.5, not installed here (SGLang's CPU kernel "
                "package is built from source): Qwen3.5 cannot be served on this CPU engine (docs/models.md)"
            )

        lib.impl(name, refuse, "CompositeExplicitAutograd")
    _LIBRARIES.append(lib)
    return missing


def register_vlm_hooks(cuda: bool) -> None:
    """Register the token-in hook with SGLang's plugin registry; without CUDA define the missing kernels."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(LOAD_MM_DATA, keep_sent_ids, HookType.AROUND)
    if not cuda:
        define_missing_cpu_kernels()
