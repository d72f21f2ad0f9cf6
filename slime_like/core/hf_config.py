"""Reading a Hugging Face checkpoint's config: the one place the engine calls AutoConfig.from_pretrained."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_hf_config(path: str | Path) -> Any:
    """The transformers config of an HF checkpoint directory, custom configuration code included.

    Like slime, this trusts the checkpoint's own code: Kimi-K2's config.json has model_type "kimi_k2" and an
    auto_map to configuration_deepseek.py in the same directory, which transformers runs only when asked to.
    """
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(path), trust_remote_code=True)
