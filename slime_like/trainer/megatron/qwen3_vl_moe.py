"""Qwen3-VL-MoE (qwen3_vl_moe, e.g. Qwen3-VL-30B-A3B / 235B-A22B): Qwen3-MoE's language model beside Qwen3-VL's tower.

The text model is Qwen3-MoE's (QK norm, softmax top-k router with normalised weights, no shared expert) under
`model.language_model`, with Qwen3-VL's interleaved 3-D mrope and deepstack features (vision_language.py builds the
tower, the rope and the deepstack hooks as for Qwen3-VL). Its checkpoint stores each layer's experts stacked
(`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`): stacked_experts.py reads and writes them per expert.
"""

from __future__ import annotations

from typing import Any

from mbridge.models import Qwen3MoEBridge

from slime_like.trainer.megatron.vision_language import VisionLanguageBridge


class Qwen3VLMoeBridge(VisionLanguageBridge, Qwen3MoEBridge):
    """Qwen3-VL-MoE: mbridge's Qwen3-MoE from text_config with interleaved 3-D mrope, beside transformers' Qwen3-VL-MoE
    vision tower and its deepstack features (VisionLanguageGPTModel)."""

    label = "Qwen3-VL-MoE"

    def _build_base_config(self, **kwargs: Any) -> Any:
        hf = self.hf_config
        # transformers' router always renormalises the top-k weights (norm_topk_prob unread), SGLang only when it is
        # true, Megatron's softmax-after-top-k always: a false config would serve another model than it trains.
        if not getattr(hf, "norm_topk_prob", True) and hf.num_experts_per_tok > 1:
            raise ValueError("norm_topk_prob=false in the HF config: Qwen3-VL-MoE is built with normalised top-k")
        dense = set(getattr(hf, "mlp_only_layers", None) or [])
        step = getattr(hf, "decoder_sparse_step", 1) or 1
        # MoE layers where transformers builds them (mbridge's Qwen3-MoE makes every layer MoE); the router in fp32
        # as transformers' softmax runs.
        kwargs.update(
            moe_layer_freq=[int(i not in dense and (i + 1) % step == 0) for i in range(hf.num_hidden_layers)],
            moe_router_dtype="fp32",
        )
        return super()._build_base_config(**kwargs)
