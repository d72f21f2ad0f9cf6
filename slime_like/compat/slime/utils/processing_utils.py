"""slime.utils.processing_utils: tokenizer and processor loading (Hugging Face transformers)."""

from __future__ import annotations

from typing import Any


def load_tokenizer(name_or_path: str, **kwargs: Any) -> Any:
    """AutoTokenizer.from_pretrained(name_or_path, **kwargs)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name_or_path, **kwargs)


def load_processor(name_or_path: str, **kwargs: Any) -> Any:
    """A multimodal processor, or None for a text-only model (slime's convention)."""
    from transformers import AutoProcessor, PreTrainedTokenizerBase

    try:
        processor = AutoProcessor.from_pretrained(name_or_path, **kwargs)
    except Exception:  # text-only checkpoints have no processor config: that is the None case
        return None
    return None if isinstance(processor, PreTrainedTokenizerBase) else processor


def build_processor_kwargs(multimodal_inputs: dict[str, Any] | None = None) -> dict[str, Any]:
    """slime's processor keyword arguments: the multimodal inputs, text as lists (no tensors, no per-token modality
    ids), every modality's outputs as tensors."""
    result = dict(multimodal_inputs) if multimodal_inputs else {}
    result["text_kwargs"] = {**result.get("text_kwargs", {}), "return_tensors": None, "return_mm_token_type_ids": False}
    for key in ("audio_kwargs", "images_kwargs", "videos_kwargs"):
        result[key] = {**result.get(key, {}), "return_tensors": "pt"}
    return result


def encode_image_for_rollout_engine(image: Any) -> str:
    """An image (PIL, path, bytes or data URL) as the PNG data URL SGLang's `image_data` takes (slime's)."""
    from buffer.multimodal import image_data_url

    return image_data_url(image)


def process_vision_info(prompt: list[dict[str, Any]], processor: Any) -> dict[str, Any]:
    """The images of chat messages' image parts (PIL images, paths, data URLs or base64 in `image`), as slime's
    {"images": [...] or None, "videos": None}; videos are not read."""
    from buffer.multimodal import load_image

    images = [
        load_image(part["image"])
        for message in prompt
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if isinstance(part, dict) and part.get("type") == "image" and part.get("image") is not None
    ]
    return {"images": images or None, "videos": None}
