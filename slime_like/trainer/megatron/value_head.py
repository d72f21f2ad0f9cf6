"""A critic's value head: mbridge's value model with a zero-initialised hidden -> 1 output layer."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def value_head_callback(model, pre_process, post_process, config, hf_config) -> None:
    """mbridge post-creation callback: replace the output layer by a zero-initialised hidden -> 1 linear.

    Zero init makes every rank's head identical without relying on RNG state, and the first values 0.
    mbridge's load_weights skips a [1, hidden] output layer, so the trunk still loads from HF.
    """
    from mbridge.utils.post_creation_callbacks import make_value_model

    make_value_model(model, pre_process, post_process, config, hf_config)
    if post_process:
        torch.nn.init.zeros_(model.output_layer.weight)


@contextmanager
def value_heads_hidden(model: list[torch.nn.Module]) -> Iterator[None]:
    """Hide value heads from state_dict while HF weights load: mbridge would map them to the LM head
    (or, with tied embeddings, load the embedding twice and fail); they keep their zero init."""
    hidden = []
    for chunk in model:
        while hasattr(chunk, "module"):
            chunk = chunk.module
        if getattr(chunk, "output_layer", None) is not None:
            hidden.append((chunk, chunk.output_layer))
            chunk.output_layer = None
    try:
        yield
    finally:
        for chunk, head in hidden:
            chunk.output_layer = head
