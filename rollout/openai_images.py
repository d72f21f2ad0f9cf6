"""Images in Chat Completions messages on the agents' endpoint (rollout/openai_endpoint.py).

A message's content parts may hold images: `{"type": "image_url", "image_url": {"url": ...}}` (OpenAI's), `{"type":
"input_image", "image_url": ...}` or `{"type": "image", "image": ...}`, the reference a `data:` URL, an http(s) URL or a
path (buffer/multimodal.py reads them). The chat template renders each as the model's vision block; the checkpoint's
processor expands its pad to the image's tokens in the ids the turn adds, and the branch keeps the images and the
processor's tensors (the sample's `multimodal_inputs` / `multimodal_train_inputs`), sending every image of the
branch with each request (rollout/sglang_vlm.py keeps the ids as sent). A branch holding images is extended only by
calls with the same images first; it is never forked (a call that changes its history starts a fresh branch).
"""

from __future__ import annotations

import hashlib
from typing import Any

from buffer import multimodal as mm
from rollout.openai_session import EndpointError

IMAGE_PARTS = frozenset({"image_url", "input_image", "image"})


def image_ref(part: dict[str, Any]) -> Any:
    """The image reference of one content part."""
    if part.get("type") in ("image_url", "input_image"):
        value = part.get("image_url")
        return value.get("url") if isinstance(value, dict) else value
    return part.get("image")


def message_images(messages: list[Any]) -> list[Any]:
    """The image references of the messages' image parts, in order."""
    return [
        image_ref(part)
        for m in messages
        if isinstance(m, dict) and isinstance(m.get("content"), list)
        for part in m["content"]
        if isinstance(part, dict) and part.get("type") in IMAGE_PARTS
    ]


def image_key(ref: Any) -> str:
    """A short identity of an image reference (the same image sent again has the same key)."""
    return hashlib.sha1(str(ref).encode()).hexdigest()


def processor_of(ctx: Any) -> Any:
    """The checkpoint's processor; 400 for a text-only model."""
    try:
        return mm.load_processor(str(ctx.args.hf_checkpoint))
    except ValueError as exc:
        raise EndpointError(400, f"image content parts need a vision-language model: {exc}") from None


def tokenize_turn(ctx: Any, text: str, refs: list[Any]) -> tuple[list[int], dict[str, Any] | None, list[Any]]:
    """The ids a turn's new text adds (each image's pad expanded by the processor when it has images), the
    processor's tensors of those images, and the images decoded."""
    if not refs:
        return list(ctx.tokenizer(text, add_special_tokens=False)["input_ids"]), None, []
    processor = processor_of(ctx)
    try:
        images = [mm.load_image(ref) for ref in refs]
        ids, train_inputs = mm.process(processor, text, images)
    except (ValueError, OSError) as exc:
        raise EndpointError(400, f"image content: {exc}") from None
    return ids, train_inputs, images


def image_data(images: list[Any]) -> list[str]:
    """SGLang's `image_data` for a branch's images."""
    return [mm.image_data_url(image) for image in images]
