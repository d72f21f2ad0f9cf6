"""SGLang server-side hooks for vision-language checkpoints (Qwen2.5-VL, Qwen3-VL), applied by rollout/sglang_launch.py.

1. Token in with images. A rollout sends the prompt's ids as the processor made them, each image already expanded
   to one `<|image_pad|>` per merged patch, with the images in `image_data`. SGLang 0.5.15 decodes such ids to text
   and runs the Hugging Face processor on it, and transformers 5's processor expands every `<|image_pad|>` it finds
   again, one image per pad: with more pads than images it fails ("coroutine raised StopIteration", HTTP 500). The
   hook hands SGLang's loader the ids with each run of pads collapsed to one (what the chat template renders) and
   keeps the ids as sent: SGLang then processes the images as usual and, when its own expansion has the length of
   the ids sent (its processor and ours agree), keeps the sent ids (base_processor.process_mm_data_async reuses
   `base_output.input_ids` of the same length), so the sequence served is exactly the rollout's, never re-tokenised
   text. A request whose pads already are collapsed is unchanged.

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


def collapse_runs(ids: list[int], pad_ids: set[int]) -> list[int]:
    """`ids` with each run of one pad id shortened to a single pad (the chat template's form of an image)."""
    out: list[int] = []
    for token in ids:
        if token in pad_ids and out and out[-1] == token:
            continue
        out.append(token)
    return out


def _pad_ids(tokens: Any) -> set[int]:
    """The image and video pad ids of SGLang's MultimodalSpecialTokens."""
    return {i for i in (getattr(tokens, "image_token_id", None), getattr(tokens, "video_token_id", None)) if i}


async def keep_sent_ids(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND hook of BaseMultimodalProcessor.load_mm_data: load with the pads collapsed, keep the ids as sent."""
    prompt = kwargs["prompt"] if "prompt" in kwargs else (args[0] if args else None)
    tokens = kwargs.get("multimodal_tokens", args[1] if len(args) > 1 else None)
    pads = _pad_ids(tokens)
    if not isinstance(prompt, list) or not prompt or not isinstance(prompt[0], int) or not pads:
        return await original(self, *args, **kwargs)
    collapsed = collapse_runs(prompt, pads)
    if len(collapsed) == len(prompt):
        return await original(self, *args, **kwargs)
    if "prompt" in kwargs:
        kwargs["prompt"] = collapsed
    else:
        args = (collapsed, *args[1:])
    output = await original(self, *args, **kwargs)
    output.input_ids = list(prompt)  # reused by process_mm_data_async when SGLang's expansion has this length
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
