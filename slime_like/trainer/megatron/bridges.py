"""mbridge bridges (HF config -> Megatron TransformerConfig and GPTModel provider) adapted to this stack.

mbridge 0.15.1 builds Megatron models from HF configs; three of its bridges need fixes here:
- Llama 3: mbridge turns `rope_scaling` into a linear position interpolation; Llama 3's "llama3" rope
  type is Megatron's `rope_scaling` (frequency-dependent scaling), which GPTModel supports directly.
- DeepSeek-V3: mbridge passes `max_position_embeddings` to MLATransformerConfig, a field that
  megatron-core 0.16 renamed `original_max_position_embeddings`; it also asks for the fused attention
  backend (CUDA only), leaves out group-limited routing (`n_group`/`topk_group`), and reads the
  rope scaling from transformers 4's `rope_scaling`.
- GLM-4.5 (glm4_moe): mbridge ignores `n_shared_experts`, `n_group`/`topk_group` and the rope settings of
  transformers 5 (`partial_rotary_factor` in `rope_parameters`), and asks for an auxiliary loss.
- GLM-4-0414 (glm4): no mbridge bridge; Qwen2's plus interleaved partial rope and sandwich norms
  (slime_like.trainer.megatron.sandwich_norms).
- MiMo (mimo): Qwen2's main layers; its MTP layers are built with --enable-mtp-training only (mtp.py).
- MiniMax-M2 (minimax_m2): no mbridge bridge; GQA with a QK norm over all heads jointly
  (slime_like.trainer.megatron.all_heads_qk_norm), partial rope from `rotary_dim`, sigmoid MoE with expert bias and no
  shared experts, every layer MoE.
- Qwen3-Next (qwen3_next) and Qwen3.5 (qwen3_5, qwen3_5_moe, read from text_config): no mbridge bridge; megatron-core's
  GatedDeltaNet and gated attention in a hybrid spec (slime_like.trainer.megatron.gated_delta_net), softmax MoE with a gated
  shared expert, zero-centered norms, partial rope.
- Every family: transformers 5 keeps `rope_theta` in `rope_parameters` (fixed on the config first).
- Multi-token prediction (`num_nextn_predict_layers` > 0, GLM-4.5, DeepSeek-V3 and MiMo checkpoints): Megatron builds
  the main layers only; the MTP layers' tensors stay in the HF checkpoint (hf_weights.untrained_hf_names), unless
  --enable-mtp-training builds them (MiMo and the DeepSeek layout: slime_like/trainer/megatron/mtp.py).
The weights themselves are converted by slime_like.trainer.megatron.hf_weights with the name maps of
slime_like.trainer.megatron.families, not by mbridge's loader (which assumes Transformer Engine names).
"""

from __future__ import annotations

from typing import Any

from mbridge.models.deepseek_v3 import DeepseekV3Bridge
from mbridge.models.glm4moe import GLM4MoEBridge
from mbridge.models.llama import LLaMABridge
from mbridge.models.qwen2 import Qwen2Bridge
from mbridge.models.qwen3moe import Qwen3MoEBridge
from megatron.core.transformer.enums import AttnBackend

from slime_like.core.hf_config import hf_field, text_config
from slime_like.core.hf_config import rope_parameters as core_rope_parameters


def rope_parameters(hf_config: Any) -> dict[str, Any]:
    """The rope settings of a transformers 4 or 5 config, as one dict (rope_theta included: 10000 if not given)."""
    return {"rope_theta": 10000.0, **core_rope_parameters(hf_config)}


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


def _default_rope(hf_config: Any, family: str) -> dict[str, Any]:
    """The rope settings of a family Megatron runs with plain rope only (a ValueError for any scaling)."""
    rope = rope_parameters(hf_config)
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", None):
        raise ValueError(f"rope_type {kind!r} in the HF config is not supported for {family} (default only)")
    return rope


def _moe_layers(hf: Any) -> list[int]:
    """1 for each MoE layer: GLM-4.7-Flash lists them (mlp_layer_types), the others make the first k dense."""
    first_k = getattr(hf, "first_k_dense_replace", None)
    by_first_k = None if first_k is None else [int(i >= first_k) for i in range(hf.num_hidden_layers)]
    types = getattr(hf, "mlp_layer_types", None)
    if not types:
        return by_first_k
    listed = [int(kind == "sparse") for kind in types[: hf.num_hidden_layers]]
    if by_first_k is not None and listed != by_first_k:
        # transformers follows mlp_layer_types, SGLang first_k_dense_replace: they would run different models.
        raise ValueError(f"mlp_layer_types and first_k_dense_replace={first_k} in the HF config disagree")
    return listed


def sigmoid_moe_args(hf: Any) -> dict[str, Any]:
    """Megatron MoE settings of DeepSeek-V3-style routing: sigmoid scores plus expert bias picks the experts,
    their normalised scores times routed_scaling_factor weigh them; shared experts; first_k_dense_replace."""
    # DeepSeek-V3's configuration code (Kimi-K2 ships it) names the routing; V2's softmax/greedy is another model.
    if (getattr(hf, "scoring_func", "sigmoid"), getattr(hf, "topk_method", "noaux_tc")) != ("sigmoid", "noaux_tc"):
        raise ValueError(
            f"scoring_func={hf.scoring_func!r} / topk_method={hf.topk_method!r} in the HF config: only DeepSeek-V3's "
            "sigmoid scores with expert bias (noaux_tc) are supported"
        )
    if not getattr(hf, "norm_topk_prob", True) and hf.num_experts_per_tok > 1:
        raise ValueError("norm_topk_prob=false in the HF config: Megatron's sigmoid router always normalises")
    extra: dict[str, Any] = {}
    if (getattr(hf, "n_group", None) or 1) > 1:
        # HF ranks a group by the sum of its 2 best experts, Megatron by its topk // topk_group best ones.
        if hf.num_experts_per_tok // hf.topk_group != 2:
            raise ValueError(
                f"num_experts_per_tok={hf.num_experts_per_tok} and topk_group={hf.topk_group} in the HF config: "
                "Megatron's group-limited routing matches transformers' only when their quotient is 2"
            )
        extra.update(moe_router_num_groups=hf.n_group, moe_router_group_topk=hf.topk_group)
    return dict(
        moe_ffn_hidden_size=hf.moe_intermediate_size,
        moe_router_bias_update_rate=0.001,
        moe_router_enable_expert_bias=True,
        moe_router_topk=hf.num_experts_per_tok,
        num_moe_experts=hf_field(hf, "num_experts"),
        moe_shared_expert_intermediate_size=hf.moe_intermediate_size * hf.n_shared_experts,
        moe_aux_loss_coeff=getattr(hf, "aux_loss_alpha", 0.001),
        moe_router_load_balancing_type="none",  # RL: no auxiliary loss
        moe_router_score_function="sigmoid",
        moe_router_pre_softmax=True,
        moe_router_topk_scaling_factor=hf.routed_scaling_factor,
        moe_layer_freq=_moe_layers(hf),
        moe_router_dtype="fp32",
        **extra,
    )


class Glm4MoeCoreBridge(GLM4MoEBridge):
    """GLM-4.5/4.6/4.7 (glm4_moe): GQA with qkv bias, partial rotate-half rope, optional QK norm, sigmoid MoE."""

    def _build_config(self):
        hf = self.hf_config
        _default_rope(hf, "glm4_moe")
        return self._build_base_config(
            qk_layernorm=bool(getattr(hf, "use_qk_norm", False)),
            add_qkv_bias=bool(getattr(hf, "attention_bias", False)),
            add_bias_linear=False,
            **sigmoid_moe_args(hf),
        )

    def _get_gptmodel_args(self) -> dict:
        # transformers rotates the first partial_rotary_factor of each head with rotate-half (not interleaved),
        # as Megatron's rotary_percent does.
        return _partial_rope_args(self.hf_config, "glm4_moe")


def _partial_rope_args(hf_config: Any, family: str) -> dict[str, Any]:
    """GPTModel rope arguments of a family rotating the first partial_rotary_factor of each head (plain rope)."""
    rope = _default_rope(hf_config, family)
    factor = rope.get("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", 1.0))
    return dict(
        vocab_size=hf_config.vocab_size,
        max_sequence_length=hf_config.max_position_embeddings,
        position_embedding_type="rope",
        rotary_base=rope["rope_theta"],
        rotary_percent=float(factor),
    )


class Glm4Bridge(Qwen2Bridge):
    """GLM-4-0414 / GLM-Z1 (glm4): dense, qkv bias, sandwich norms, interleaved rope on half of each head."""

    sandwich_norms = True  # read by the layer spec builders (model.py and below)

    def _build_config(self):
        # transformers' Glm4 rotates interleaved pairs (x0, x1), (x2, x3)... of the rotary part.
        return self._build_base_config(add_qkv_bias=bool(self.hf_config.attention_bias), rotary_interleaved=True)

    def _get_gptmodel_args(self) -> dict:
        return _partial_rope_args(self.hf_config, "glm4")

    def _get_transformer_layer_spec(self, vp_stage: int | None = None):
        from slime_like.trainer.megatron.sandwich_norms import add_sandwich_norms

        return add_sandwich_norms(super()._get_transformer_layer_spec(vp_stage))


class MimoBridge(Qwen2Bridge):
    """MiMo-7B (mimo): Qwen2's layers (qkv bias, plain rope); its MTP layers only with --enable-mtp-training."""

    def _build_config(self) -> Any:
        hf = self.hf_config
        # Megatron runs plain full attention: a config asking for rope scaling or a sliding window is another model.
        _default_rope(hf, "mimo")
        if getattr(hf, "use_sliding_window", False):
            raise ValueError("use_sliding_window=true in the HF config is not supported for mimo (full attention)")
        return super()._build_config()


class DeepseekV3CoreBridge(DeepseekV3Bridge):
    """DeepSeek-V3, Kimi-K2 and GLM-4.7-Flash (MLA + MoE with shared experts and expert bias), megatron-core 0.16."""

    def _build_config(self):
        hf = self.hf_config
        rope = rope_parameters(hf)
        kind = rope.get("rope_type", rope.get("type", "default"))
        yarn = kind == "yarn"
        # Megatron's MLA rotates interleaved pairs (DeepSeek's layout, transformers' rope_interleave=true) of the
        # whole rope part of each head.
        if not getattr(hf, "rope_interleave", True):
            raise ValueError("rope_interleave=false in the HF config: Megatron's MLA rotates interleaved pairs only")
        if float(rope.get("partial_rotary_factor", 1.0)) != 1.0:
            raise ValueError("partial_rotary_factor in the HF config: MLA rotates all qk_rope_head_dim dimensions")
        return self._build_base_config(
            attention_backend=AttnBackend.auto,
            qk_layernorm=True,
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
            **sigmoid_moe_args(hf),
        )


class GlmMoeDsaBridge(DeepseekV3CoreBridge):
    """GLM-5 (glm_moe_dsa): DeepSeek-V3's MLA + MoE with megatron-core's DSA sparse attention in every layer
    (slime_like.trainer.megatron.dsa)."""

    builds_own_layer_spec = True  # model.make_bridge keeps _get_transformer_layer_spec on the CPU too

    def _build_config(self) -> Any:
        from slime_like.trainer.megatron.dsa import dsa_config_args

        dsa = dsa_config_args(self.hf_config, self.dtype)
        config = super()._build_config()
        if config.recompute_granularity == "selective" and "core_attn" in (config.recompute_modules or []):
            # MLA's checkpointed core attention drops the hidden states and query latents the indexer reads.
            raise ValueError(
                "--recompute-granularity selective with core_attn: megatron-core 0.16 cannot recompute DSA's core "
                "attention (GLM-5); use --recompute-granularity full or --recompute-modules without core_attn"
            )
        for field, value in dsa.items():
            setattr(config, field, value)
        return config

    def _get_transformer_layer_spec(self, vp_stage: int | None = None):
        from slime_like.trainer.megatron.dsa import add_dsa

        local = getattr(self, "slime_like_local_spec", True)
        if local:
            from slime_like.trainer.megatron.layer_specs import local_layer_spec

            spec = local_layer_spec(self, vp_stage)
        else:
            spec = super()._get_transformer_layer_spec(vp_stage)
        return add_dsa(spec, local, bool(getattr(self.hf_config, "indexer_rope_interleave", False)))


class MiniMaxM2Bridge(Qwen3MoEBridge):
    """MiniMax-M2 (minimax_m2): GQA with an all-heads QK norm, partial rope, sigmoid MoE (expert bias) in every layer."""

    all_heads_qk_norm = True  # read by the layer spec builders (model.py and below)

    def _build_config(self) -> Any:
        hf = self.hf_config
        _default_rope(hf, "minimax_m2")
        _minimax_m2_rotary_percent(hf)  # refuses a rope SGLang and transformers would apply differently
        # What SGLang's MiniMaxM2 model reads, where Megatron would run another model.
        unsupported = {
            "scoring_func": (getattr(hf, "scoring_func", "sigmoid"), "sigmoid"),
            "use_routing_bias": (bool(getattr(hf, "use_routing_bias", True)), True),
            "qk_norm_type": (getattr(hf, "qk_norm_type", "per_layer"), "per_layer"),
            "shared_intermediate_size": (getattr(hf, "shared_intermediate_size", 0) or 0, 0),
        }
        for field, (value, supported) in unsupported.items():
            if value != supported:
                raise ValueError(f"{field}={value!r} in the HF config: minimax_m2 is supported with {supported!r} only")
        if getattr(hf, "use_qk_norm", False) and self.mpu.tp_size > hf.num_key_value_heads:
            # The key norm spans all key heads; ranks beyond num_key_value_heads would hold copies of them.
            raise ValueError(
                f"--tensor-model-parallel-size {self.mpu.tp_size} is larger than num_key_value_heads="
                f"{hf.num_key_value_heads} in the HF config: MiniMax-M2's QK norm over all heads needs each TP rank "
                f"to hold its own key heads; use a tensor-parallel size of at most {hf.num_key_value_heads}"
            )
        return self._build_base_config(
            qk_layernorm=bool(getattr(hf, "use_qk_norm", False)),
            add_qkv_bias=False,
            add_bias_linear=False,
            # The experts are intermediate_size wide; there is no dense MLP and no shared expert.
            moe_ffn_hidden_size=hf.intermediate_size,
            num_moe_experts=hf_field(hf, "num_experts"),
            moe_router_topk=hf.num_experts_per_tok,
            moe_router_score_function="sigmoid",
            moe_router_enable_expert_bias=True,
            moe_router_bias_update_rate=0.001,
            moe_router_pre_softmax=True,
            moe_router_load_balancing_type="none",  # RL: no auxiliary loss
            moe_aux_loss_coeff=getattr(hf, "router_aux_loss_coef", 0.001),
            moe_router_dtype="fp32",
        )

    def _get_gptmodel_args(self) -> dict:
        args = _partial_rope_args(self.hf_config, "minimax_m2")
        args["rotary_percent"] = _minimax_m2_rotary_percent(self.hf_config)
        return args

    def _get_transformer_layer_spec(self, vp_stage: int | None = None):
        from slime_like.trainer.megatron.all_heads_qk_norm import add_all_heads_qk_norm

        spec = super()._get_transformer_layer_spec(vp_stage)
        return add_all_heads_qk_norm(spec) if self.config.qk_layernorm else spec


def _minimax_m2_rotary_percent(hf: Any) -> float:
    """The rotated fraction of each head: SGLang (and MiniMax's own code) rotate the first rotary_dim dimensions,
    transformers 5 the first partial_rotary_factor; a config where the two differ is refused."""
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    rotary_dim = getattr(hf, "rotary_dim", None) or head_dim  # SGLang's default: the whole head
    factor = rope_parameters(hf).get("partial_rotary_factor", getattr(hf, "partial_rotary_factor", None))
    if factor is not None and abs(float(factor) * head_dim - rotary_dim) > 1e-6:
        raise ValueError(
            f"rotary_dim={rotary_dim} and partial_rotary_factor={factor} (head_dim={head_dim}) in the HF config "
            "disagree: SGLang rotates rotary_dim dimensions (the whole head without it), transformers "
            "partial_rotary_factor of them. Make them agree"
        )
    return rotary_dim / head_dim


class Qwen3NextBridge(Qwen3MoEBridge):
    """Qwen3-Next (qwen3_next): gated delta net layers between gated full attention (QK norm, partial rope), softmax
    MoE with a gated shared expert, zero-centered RMSNorms (slime_like.trainer.megatron.gated_delta_net)."""

    builds_own_layer_spec = True  # model.make_bridge keeps _get_transformer_layer_spec on the CPU too
    takes_torch_attention = True  # hybrid_block_spec swaps torch's core attention into its gated attention layers

    def _build_config(self) -> Any:
        from megatron.core import parallel_state as mpu

        from slime_like.trainer.megatron.gated_delta_net import linear_attention_pattern, require_kernels

        hf = self.hf_config
        require_kernels()  # a missing fla on GPU is named at start
        _default_rope(hf, hf.model_type)
        if mpu.get_context_parallel_world_size() > 1:
            raise ValueError(
                "--context-parallel-size > 1: megatron-core 0.16's gated delta net has no context parallel"
            )
        moe = bool(hf_field(hf, "num_experts"))
        if moe and not getattr(hf, "norm_topk_prob", True) and hf.num_experts_per_tok > 1:
            raise ValueError(
                "norm_topk_prob=false in the HF config: Megatron's softmax router (top-k, then softmax) normalises"
            )
        if getattr(hf, "attention_bias", False):
            raise ValueError("attention_bias=true in the HF config is not supported for qwen3_next")
        args: dict[str, Any] = dict(
            qk_layernorm=True,
            add_qkv_bias=False,
            add_bias_linear=False,
            layernorm_zero_centered_gamma=True,
            attention_output_gate=True,
            experimental_attention_variant="gated_delta_net",
            linear_attention_freq=linear_attention_pattern(hf),
            linear_conv_kernel_dim=hf.linear_conv_kernel_dim,
            linear_key_head_dim=hf.linear_key_head_dim,
            linear_value_head_dim=hf.linear_value_head_dim,
            linear_num_key_heads=hf.linear_num_key_heads,
            linear_num_value_heads=hf.linear_num_value_heads,
        )
        if moe:
            sparse = set(getattr(hf, "mlp_only_layers", None) or [])
            step = getattr(hf, "decoder_sparse_step", 1) or 1
            args.update(
                num_moe_experts=hf_field(hf, "num_experts"),
                moe_ffn_hidden_size=hf.moe_intermediate_size,
                moe_router_topk=hf.num_experts_per_tok,
                moe_router_score_function="softmax",
                moe_router_pre_softmax=False,  # softmax over the top-k logits: transformers' normalised top-k
                moe_shared_expert_intermediate_size=hf.shared_expert_intermediate_size,
                moe_shared_expert_gate=True,
                moe_router_load_balancing_type="none",  # RL: no auxiliary loss
                moe_aux_loss_coeff=getattr(hf, "router_aux_loss_coef", 0.001),
                moe_router_dtype="fp32",
                moe_layer_freq=[int(i not in sparse and (i + 1) % step == 0) for i in range(hf.num_hidden_layers)],
            )
        return self._build_base_config(**args)

    def _get_gptmodel_args(self) -> dict:
        return _partial_rope_args(self.hf_config, self.hf_config.model_type)

    def _get_transformer_layer_spec(self, vp_stage: int | None = None):
        from slime_like.trainer.megatron.gated_delta_net import hybrid_block_spec

        self.has_vp_stage = True  # read by LLMBridge's provider
        local, kernels = getattr(self, "slime_like_local_spec", True), getattr(self, "slime_like_local_kernels", None)
        attention = getattr(self, "slime_like_torch_attention", None)  # make_bridge's choice (torch_attention.py)
        return hybrid_block_spec(self.config, local, vp_stage, kernels, attention)


class Qwen3_5Bridge(Qwen3NextBridge):
    """Qwen3.5 / 3.6 text models (qwen3_5, qwen3_5_moe): Qwen3-Next's layers, read from the config's text_config
    (the bridge's hf_config is the text config; the vision tower and MTP layers are not built)."""

    def __init__(self, hf_config: Any, *args: Any, **kwargs: Any) -> None:
        text = text_config(hf_config)
        fix_hf_config(text)
        super().__init__(text, *args, **kwargs)

    def _build_config(self) -> Any:
        # Megatron's gated attention is Qwen3-Next's (always gated); a config without the gate is another model.
        if not getattr(self.hf_config, "attn_output_gate", True):
            raise ValueError("attn_output_gate=false in the HF config: Qwen3.5's attention is built with its gate only")
        return super()._build_config()
