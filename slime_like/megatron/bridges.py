"""mbridge bridges (HF config -> Megatron TransformerConfig and GPTModel provider) adapted to this stack.

mbridge 0.15.1 builds Megatron models from HF configs; three of its bridges need fixes here:
- Llama 3: mbridge turns `rope_scaling` into a linear position interpolation; Llama 3's "llama3" rope
  type is Megatron's `rope_scaling` (frequency-dependent scaling), which GPTModel supports directly.
- DeepSeek-V3: mbridge passes `max_position_embeddings` to MLATransformerConfig, a field that
  megatron-core 0.16 renamed `original_max_position_embeddings`; it also asks for the fused attention
  backend (CUDA only), leaves out group-limited routing (`n_group`/`topk_group`), and reads the
  rope scaling from transformers 4's `rope_scaling`.
- Every family: transformers 5 keeps `rope_theta` in `rope_parameters` (fixed on the config first).
The weights themselves are converted by slime_like.megatron.hf_weights with the name maps of
slime_like.megatron.families, not by mbridge's loader (which assumes Transformer Engine names).
"""

from __future__ import annotations

from typing import Any

from mbridge.models.deepseek_v3 import DeepseekV3Bridge
from mbridge.models.llama import LLaMABridge
from megatron.core.transformer.enums import AttnBackend


def rope_parameters(hf_config: Any) -> dict[str, Any]:
    """The rope settings of a transformers 4 or 5 config, as one dict (rope_theta included)."""
    params = dict(getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {})
    if "rope_theta" not in params:
        params["rope_theta"] = getattr(hf_config, "rope_theta", None) or 10000.0
    return params


def fix_hf_config(hf_config: Any) -> None:
    """Expose rope_theta at the top level, where mbridge reads it (transformers 5 moved it)."""
    if getattr(hf_config, "rope_theta", None) is None:
        hf_config.rope_theta = rope_parameters(hf_config)["rope_theta"]


class Llama3Bridge(LLaMABridge):
    """Llama 2/3: Llama 3's frequency-dependent rope scaling as Megatron's `rope_scaling`."""

    # Megatron's RotaryEmbedding fixes these three; only `factor` is a parameter.
    _MEGATRON_LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}

    def _get_gptmodel_args(self) -> dict:
        args = dict(
            vocab_size=self.hf_config.vocab_size,
            max_sequence_length=self.hf_config.max_position_embeddings,
            position_embedding_type="rope",
            rotary_base=self.hf_config.rope_theta,
        )
        rope = rope_parameters(self.hf_config)
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind == "llama3":
            for key, want in self._MEGATRON_LLAMA3_ROPE.items():
                if float(rope.get(key, want)) != want:
                    raise ValueError(
                        f"rope_parameters.{key}={rope[key]} in the HF config: Megatron's llama3 rope scaling "
                        f"supports only {key}={want}"
                    )
            args.update(rope_scaling=True, rope_scaling_factor=float(rope["factor"]))
        elif kind not in ("default", None):
            raise ValueError(f"rope_type {kind!r} in the HF config is not supported for Llama (default or llama3)")
        return args


class DeepseekV3CoreBridge(DeepseekV3Bridge):
    """DeepSeek-V3 (MLA + MoE with shared experts and expert bias) for megatron-core 0.16."""

    def _build_config(self):
        hf = self.hf_config
        rope = rope_parameters(hf)
        kind = rope.get("rope_type", rope.get("type", "default"))
        yarn = kind == "yarn"
        moe_layer_freq = [0 if i < hf.first_k_dense_replace else 1 for i in range(hf.num_hidden_layers)]
        extra: dict[str, Any] = {}
        if getattr(hf, "n_group", None) and hf.n_group > 1:
            extra.update(moe_router_num_groups=hf.n_group, moe_router_group_topk=hf.topk_group)
        if not getattr(hf, "norm_topk_prob", True):
            raise ValueError("norm_topk_prob=false in the HF config: Megatron's sigmoid router always normalises")
        if getattr(hf, "num_nextn_predict_layers", 0):
            raise ValueError("num_nextn_predict_layers > 0 (multi-token prediction) is not supported; set it to 0")
        return self._build_base_config(
            attention_backend=AttnBackend.auto,
            qk_layernorm=True,
            moe_ffn_hidden_size=hf.moe_intermediate_size,
            moe_router_bias_update_rate=0.001,
            moe_router_enable_expert_bias=True,
            moe_router_topk=hf.num_experts_per_tok,
            num_moe_experts=hf.n_routed_experts,
            moe_shared_expert_intermediate_size=hf.moe_intermediate_size * hf.n_shared_experts,
            moe_aux_loss_coeff=getattr(hf, "aux_loss_alpha", 0.001),
            moe_router_load_balancing_type="none",  # RL: no auxiliary loss
            moe_router_score_function="sigmoid",
            moe_router_pre_softmax=True,
            moe_router_topk_scaling_factor=hf.routed_scaling_factor,
            moe_layer_freq=moe_layer_freq,
            moe_router_dtype="fp32",
            q_lora_rank=hf.q_lora_rank,
            kv_lora_rank=hf.kv_lora_rank,
            qk_head_dim=hf.qk_nope_head_dim,
            qk_pos_emb_head_dim=hf.qk_rope_head_dim,
            v_head_dim=hf.v_head_dim,
            rotary_base=rope["rope_theta"],
            rope_type="yarn" if yarn else "rope",
            rotary_scaling_factor=float(rope.get("factor", 1.0)),
            mscale=float(rope.get("mscale", 1.0)),
            mscale_all_dim=float(rope.get("mscale_all_dim", 0.0)),
            original_max_position_embeddings=int(
                rope.get("original_max_position_embeddings", hf.max_position_embeddings)
            ),
            beta_fast=float(rope.get("beta_fast", 32)),
            beta_slow=float(rope.get("beta_slow", 1)),
            **extra,
        )
