"""Images in prompt data (slime's --multimodal-keys): loading, chat messages with image parts, the processor's tokens.

A row names its images in the column --multimodal-keys maps the type to ('{"image": "images"}'): a list (or one) of
parquet image structs as Hugging Face datasets store them (`{"bytes": ..., "path": ...}`), raw bytes, file paths
(absolute, or relative to the data file's folder or the working directory), `data:` URLs, base64 strings, http(s)
URLs (fetched when reachable), or Qwen-style dicts (`{"type": "image", "image": ...}`). As in slime the prompt becomes
chat messages whose `<image>` placeholders are replaced, in order, by image content parts; the model's processor
renders them (its chat template puts `<|vision_start|><|image_pad|><|vision_end|>` per image and expands the pad to
one token per merged patch), so prompt lengths count image tokens.

A sample carries slime's fields: `multimodal_inputs` ({"images": [PIL images]}, what SGLang is sent) and
`multimodal_train_inputs` (the processor's tensors but the ids: `pixel_values`, `image_grid_thw`, what the trainer
feeds the vision tower).
"""

from __future__ import annotations

import base64
import binascii
import functools
import io
import json
import re
import weakref
from pathlib import Path
from typing import Any

IMAGE_PLACEHOLDER = "<image>"  # slime's MultimodalTypes.IMAGE.placeholder
SUPPORTED_TYPES = ("image",)
# Processor outputs that are the prompt, not the images (slime's _PROCESSOR_PROMPT_KEYS, and transformers 5's
# per-token modality ids).
PROMPT_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids")
URL_TIMEOUT_S = 20.0


class ImageError(ValueError):
    """An image that cannot be read or decoded, or images that do not match the prompt's placeholders."""


def parse_multimodal_keys(value: str | dict[str, str] | None) -> dict[str, str] | None:
    """--multimodal-keys as a {type: column} dict (slime's JSON); only images are supported."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f'--multimodal-keys must be JSON mapping a type to a data column, e.g. \'{{"image": "images"}}\' '
                f"({exc.msg})"
            ) from None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ValueError(f"--multimodal-keys must map a type to a column name, e.g. {{'image': 'images'}}: {value!r}")
    unsupported = sorted(set(value) - set(SUPPORTED_TYPES))
    if unsupported:
        raise ValueError(
            f"--multimodal-keys: {unsupported} not supported; only images ({{'image': '<column>'}}): video and "
            "audio rows are not read yet"
        )
    return dict(value)


def _fetch(url: str) -> bytes:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=URL_TIMEOUT_S) as response:  # noqa: S310 (http(s) only, checked)
            return response.read()
    except OSError as exc:
        raise ImageError(
            f"image URL {url} could not be fetched ({exc}); offline, store the images in the data (parquet bytes "
            "or file paths)"
        ) from None


def _resolve_path(text: str, base_dir: Path | None) -> Path | None:
    path = Path(text).expanduser()
    candidates = [path] if path.is_absolute() else [p for p in (base_dir and base_dir / path, path) if p]
    return next((p for p in candidates if p.is_file()), None)


def image_bytes(item: Any, base_dir: Path | None = None) -> bytes:
    """The encoded bytes of one image reference (see the module docstring for the forms)."""
    if isinstance(item, bytes | bytearray | memoryview):
        return bytes(item)
    if isinstance(item, dict):
        if item.get("bytes") is not None:
            return image_bytes(item["bytes"], base_dir)
        for key in ("image", "image_url", "path", "url"):
            value = item.get(key)
            if isinstance(value, dict):  # OpenAI's {"image_url": {"url": ...}}
                value = value.get("url")
            if value is not None:
                return image_bytes(value, base_dir)
        raise ImageError(f"image entry {sorted(item)} has no bytes, path or URL")
    if not isinstance(item, str):
        raise ImageError(f"an image must be bytes, a path, a URL or a dict with one; got {type(item).__name__}")
    if item.startswith("data:"):
        head, _, data = item.partition(",")
        if ";base64" not in head:
            raise ImageError(f"data URL {head[:40]}... is not base64-encoded")
        return _b64(data)
    if re.match(r"https?://", item):
        return _fetch(item)
    if item.startswith("file://"):
        item = item[len("file://") :]
    path = _resolve_path(item, base_dir)
    if path is not None:
        return path.read_bytes()
    if len(item) > 256 and re.fullmatch(r"[A-Za-z0-9+/=\s]+", item):
        return _b64(item)
    where = f" (looked in {base_dir} and the working directory)" if base_dir else ""
    raise ImageError(f"image file {item!r} not found{where}")


def _b64(data: str) -> bytes:
    try:
        return base64.b64decode(data, validate=False)
    except (binascii.Error, ValueError) as exc:
        raise ImageError(f"image is not valid base64 ({exc})") from None


def load_image(item: Any, base_dir: Path | None = None) -> Any:
    """One image reference as a decoded RGB PIL image (a PIL image is taken as it is, converted to RGB)."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(item, Image.Image):
        return item if item.mode == "RGB" else item.convert("RGB")
    raw = image_bytes(item, base_dir)
    try:
        image = Image.open(io.BytesIO(raw))
        image.load()
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise ImageError(f"image data ({len(raw)} bytes) is not a readable image: {exc}") from None
    return image.convert("RGB")


def row_images(row: dict[str, Any], column: str, base_dir: Path | None = None) -> list[Any]:
    """The decoded images of a row's image column (a list of references, one reference, or nothing)."""
    value = row.get(column)
    if value is None:
        return []
    if hasattr(value, "tolist") and not isinstance(value, bytes | str):
        value = value.tolist()
    if not isinstance(value, list | tuple):
        value = [value]
    images = []
    for i, item in enumerate(value):
        try:
            images.append(load_image(item, base_dir))
        except ImageError as exc:
            raise ImageError(f"column {column!r}, image {i}: {exc}") from None
    return images


def build_messages(prompt: str | list[dict[str, Any]], images: list[Any]) -> list[dict[str, Any]]:
    """slime's _build_messages for images: chat messages whose `<image>` placeholders become image parts
    ({"type": "image"}; the images themselves go to multimodal_inputs, in order; a string prompt is one user message). Messages already made of content parts are kept; their image parts
    count. The number of images must equal the number of placeholders (slime asserts the same)."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    placeholders = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            placeholders += sum(1 for part in content if isinstance(part, dict) and part.get("type") == "image")
            continue
        if not isinstance(content, str):
            raise ImageError(f"message content must be text or a list of parts, got {type(content).__name__}")
        parts: list[dict[str, Any]] = []
        for segment in re.split(f"({re.escape(IMAGE_PLACEHOLDER)})", content):
            if segment == IMAGE_PLACEHOLDER:
                placeholders += 1
                parts.append({"type": "image"})  # the image itself is in multimodal_inputs, in order
            elif segment:
                parts.append({"type": "text", "text": segment})
        message["content"] = parts
    if placeholders != len(images):
        raise ImageError(
            f"the prompt has {placeholders} {IMAGE_PLACEHOLDER!r} placeholders (or image parts) but the row has "
            f"{len(images)} images: put one {IMAGE_PLACEHOLDER} where each image goes"
        )
    return messages


@functools.lru_cache(maxsize=4)
def load_processor(path: str) -> Any:
    """The checkpoint's multimodal processor (AutoProcessor), cached; a clear error for a text-only checkpoint."""
    from transformers import AutoProcessor, PreTrainedTokenizerBase

    try:
        processor = AutoProcessor.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"--multimodal-keys needs the checkpoint's processor; {path} has none loadable: {exc}"
        ) from None
    if isinstance(processor, PreTrainedTokenizerBase) or not hasattr(processor, "image_processor"):
        raise ValueError(
            f"--multimodal-keys: {path} is a text-only checkpoint (no image processor in it): use a vision-language "
            "checkpoint (Qwen2.5-VL, Qwen3-VL, Qwen3.5) or drop --multimodal-keys"
        )
    return processor


def render_text(processor: Any, messages: list[dict[str, Any]], chat_template_kwargs: dict | None = None) -> str:
    """The chat template's text of messages with image parts (one vision block per image, pads not expanded)."""
    return processor.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **(chat_template_kwargs or {})
    )


def process(processor: Any, text: str, images: list[Any]) -> tuple[list[int], dict[str, Any] | None]:
    """The processor's prompt ids (each image's pad expanded to its tokens) and its image tensors (train inputs)."""
    out = processor(text=[text], images=images or None, return_tensors="pt")
    ids = [int(t) for t in out["input_ids"][0]]
    train = {k: v for k, v in out.items() if k not in PROMPT_KEYS}
    return ids, (train or None)


def sample_images(sample: Any) -> list[Any]:
    """The images of a sample's multimodal_inputs (slime's {"images": [...]}), [] for a text sample."""
    inputs = getattr(sample, "multimodal_inputs", None) or {}
    return list(inputs.get("images") or [])


# Data URLs of live images by id: a group's samples share their images, and every turn of a sample sends them all
# again; an entry goes when its image does.
_URLS: dict[int, tuple[Any, str]] = {}


def image_data_url(image: Any) -> str:
    """An image as SGLang's `image_data` takes it: a PNG data URL (slime's encode_image_for_rollout_engine)."""
    if isinstance(image, str) and image.startswith("data:"):
        return image
    key = id(image)
    cached = _URLS.get(key)
    if cached is not None and cached[0]() is image:
        return cached[1]
    buffer = io.BytesIO()
    load_image(image).save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
    try:
        _URLS[key] = (weakref.ref(image, lambda _, k=key: _URLS.pop(k, None)), url)
    except TypeError:  # bytes, paths: nothing to follow
        pass
    return url


def prompt_inputs(processor: Any, prompt: str | list[dict[str, Any]], images: list[Any], chat_template_kwargs=None):
    """A sample's prompt ids and train inputs: a rendered text prompt as it is, chat messages through the template."""
    text = prompt if isinstance(prompt, str) else render_text(processor, prompt, chat_template_kwargs)
    return process(processor, text, images)


def merge_train_inputs(chunks: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """Per-turn multimodal_train_inputs joined into one (each tensor key concatenated along dim 0, as slime's
    geo3k_vlm_multi_turn merges turns); None when no turn has any."""
    import torch

    by_key: dict[str, list[Any]] = {}
    for chunk in chunks:
        for key, value in (chunk or {}).items():
            if value is not None:
                by_key.setdefault(key, []).append(value)
    merged = {k: torch.cat(v, dim=0) for k, v in by_key.items() if all(isinstance(t, torch.Tensor) for t in v)}
    return merged or None


# Messages rendered before an observation so the chat template's preamble (a default system prompt) can be cut off
# (slime's geo3k_vlm_multi_turn: DUMMY_MESSAGES).
_PREAMBLE = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "I am a user."}]


def observation_inputs(
    processor: Any, message: dict[str, Any], images: list[Any], chat_template_kwargs: dict | None = None
) -> tuple[list[int], dict[str, Any] | None, list[Any]]:
    """One environment turn with images, as a multi-turn rollout appends it: the message's ids as the chat template
    renders it after earlier turns (up to the next assistant header), its image tensors, and its decoded images."""
    images = [load_image(image) for image in images]
    kwargs = chat_template_kwargs or {}
    before = processor.apply_chat_template(_PREAMBLE, tokenize=False, add_generation_prompt=False, **kwargs)
    text = processor.apply_chat_template([*_PREAMBLE, message], tokenize=False, add_generation_prompt=True, **kwargs)
    if not text.startswith(before):
        raise ValueError("the chat template renders earlier turns differently once a message follows them")
    ids, train_inputs = process(processor, text[len(before) :], images)
    return ids, train_inputs, images


def append_observation(sample: Any, turn: tuple[list[int], dict[str, Any] | None, list[Any]]) -> None:
    """Append an environment turn (observation_inputs) to a sample: its tokens with loss mask 0 and log-prob 0, its
    images to multimodal_inputs and its tensors merged into multimodal_train_inputs (slime's per-turn merge)."""
    ids, train_inputs, images = turn
    sample.tokens = list(sample.tokens) + list(ids)
    sample.response_length += len(ids)
    sample.loss_mask = (sample.loss_mask or []) + [0] * len(ids)
    sample.rollout_log_probs = (sample.rollout_log_probs or []) + [0.0] * len(ids)
    sample.add_version_spans(len(ids))  # no weights generated them
    inputs = dict(sample.multimodal_inputs or {})
    inputs["images"] = list(inputs.get("images") or []) + list(images)
    sample.multimodal_inputs = inputs
    sample.multimodal_train_inputs = merge_train_inputs([sample.multimodal_train_inputs, train_inputs])
