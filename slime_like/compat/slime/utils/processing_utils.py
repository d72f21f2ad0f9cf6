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
