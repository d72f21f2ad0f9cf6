"""Megatron's local (non-Transformer-Engine) layer specs for the bridges, with the families' own layers in them
(MLA's core attention, sandwich norms, all-heads q/k norms) and, when make_bridge chose it, torch's core attention
(torch_attention.py). Its own module: bridges and model both use it."""

from __future__ import annotations


def local_layer_spec(self, vp_stage: int | None = None):
    """Replacement for LLMBridge._get_transformer_layer_spec building Megatron's local spec."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.transformer.multi_latent_attention import MLASelfAttention

    self.has_vp_stage = True  # read by LLMBridge's provider
    spec = get_gpt_decoder_block_spec(
        self.config, use_transformer_engine=False, normalization=self.config.normalization, vp_stage=vp_stage
    )
    for layer in spec.layer_specs:
        attention = layer.submodules.self_attention
        if attention.module is MLASelfAttention:
            attention.submodules.core_attention = _mla_core_attention()
    torch_path = getattr(self, "slime_like_torch_attention", None)
    if torch_path is not None:  # varlen / flex / sdpa: packed (THD) micro-batches without a [T, T] mask
        from slime_like.trainer.megatron.torch_attention import use_torch_attention

        use_torch_attention(spec, torch_path)
    if getattr(self, "sandwich_norms", False):
        from slime_like.trainer.megatron.sandwich_norms import add_sandwich_norms

        add_sandwich_norms(spec)
    if getattr(self, "all_heads_qk_norm", False) and self.config.qk_layernorm:
        from slime_like.trainer.megatron.all_heads_qk_norm import add_all_heads_qk_norm

        add_all_heads_qk_norm(spec)
    kernels = getattr(self, "slime_like_local_kernels", None)  # make_bridge's choice (local_kernels_flags.py)
    fusable = self.config.normalization == "RMSNorm" and not self.config.layernorm_zero_centered_gamma
    if kernels is not None and kernels.fused_elementwise and fusable:
        from slime_like.trainer.megatron.fused_ops import fuse_norms

        fuse_norms(spec)
    if kernels is not None and kernels.grouped_experts:
        from slime_like.trainer.megatron.grouped_experts import use_grouped_experts

        use_grouped_experts(spec)
    return spec


def _mla_core_attention() -> type:
    """Megatron's local DotProductAttention taking MLA's k/v head sizes (it assumes kv_channels for both)."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class MLADotProductAttention(DotProductAttention):
        def __init__(self, *args, k_channels: int | None = None, v_channels: int | None = None, **kwargs) -> None:
            # Attention.__init__ builds one without the channels, then MLASelfAttention replaces it; MLA
            # passes its softmax_scale, so only the output width needs v_channels.
            super().__init__(*args, **kwargs)
            if v_channels is not None:
                self.hidden_size_per_partition = v_channels * self.num_attention_heads_per_partition

    return MLADotProductAttention
