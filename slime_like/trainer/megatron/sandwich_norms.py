"""Sandwich norms (GLM-4-0414): an RMSNorm on the attention output and on the MLP output, before each residual add.

megatron-core 0.16's TransformerLayer has norms before attention and MLP only. Its layer spec names the attention and
MLP module classes, so subclasses that normalise their own output express the two extra norms without touching the
layer: their weights are `self_attention.post_layernorm.weight` and `mlp.post_layernorm.weight`.
"""

from __future__ import annotations

from typing import Any

from megatron.core.transformer.attention import SelfAttention
from megatron.core.transformer.mlp import MLP


def _post_norm(config: Any) -> Any:
    """The RMSNorm the layer spec's other norms use: Transformer Engine's where installed, torch's otherwise."""
    from slime_like.trainer.megatron.cpu_compat import transformer_engine_available

    if transformer_engine_available():
        from megatron.core.extensions.transformer_engine import TENorm as Norm
    else:
        from megatron.core.transformer.torch_norm import WrappedTorchNorm as Norm
    return Norm(config=config, hidden_size=config.hidden_size, eps=config.layernorm_epsilon)


def _normalised(module: Any, output: tuple) -> tuple:
    out, bias = output
    if bias is not None:  # the bias is added after the norm otherwise: the norm must see it
        out, bias = out + bias, None
    return (module.post_layernorm(out), bias)


class PostNormSelfAttention(SelfAttention):
    """Megatron's self-attention with an RMSNorm on its output (GLM-4's post_self_attn_layernorm)."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.post_layernorm = _post_norm(config)

    def forward(self, *args: Any, **kwargs: Any) -> tuple:
        return _normalised(self, super().forward(*args, **kwargs))


class PostNormMLP(MLP):
    """Megatron's dense MLP with an RMSNorm on its output (GLM-4's post_mlp_layernorm)."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.post_layernorm = _post_norm(config)

    def forward(self, *args: Any, **kwargs: Any) -> tuple:
        return _normalised(self, super().forward(*args, **kwargs))

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None) -> dict:
        """MLP's, plus the norm's (MLP's own asks every child for sharded_state_dict, which a torch norm lacks)."""
        from megatron.core.transformer.utils import sharded_state_dict_default

        norm = self._modules.pop("post_layernorm")
        try:
            state = super().sharded_state_dict(prefix, sharded_offsets, metadata)
        finally:
            self._modules["post_layernorm"] = norm
        # Replicated over TP: the TP group gives each rank's copy its replica id.
        state.update(
            sharded_state_dict_default(
                norm, f"{prefix}post_layernorm.", sharded_offsets, metadata, tp_group=self.tp_group
            )
        )
        return state


def add_sandwich_norms(spec: Any) -> Any:
    """The decoder block spec with post-attention and post-MLP norms in every layer (dense layers only)."""
    for layer in spec.layer_specs:  # layers may share one spec object
        attention, mlp = layer.submodules.self_attention, layer.submodules.mlp
        if (attention.module, mlp.module) == (PostNormSelfAttention, PostNormMLP):
            continue
        if attention.module is not SelfAttention or mlp.module is not MLP:
            raise ValueError(f"sandwich norms need dense self-attention layers, not {attention.module}/{mlp.module}")
        attention.module, mlp.module = PostNormSelfAttention, PostNormMLP
    return spec
