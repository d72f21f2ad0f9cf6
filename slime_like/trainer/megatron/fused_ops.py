"""Fused elementwise kernels for Megatron's local layer spec (no Transformer Engine): RMSNorm, q/k norms, RoPE, SwiGLU.

Without Transformer Engine each of these runs as several unfused torch ops (a read and a write of the activations
per op). Here each is one `torch.compile`d function (inductor: Triton kernels on CUDA, C++ on the CPU) whose eager
body is the reference math, with the backward derived by AOTAutograd from the same graph:
- RMSNorm: FusedRMSNorm replaces WrappedTorchNorm (torch.nn.RMSNorm) in the spec, for the layer norms, the final norm
  and the q/k norms; it keeps the `weight` parameter, so checkpoints, weight sync and the HF name maps are unchanged.
  The hybrid spec's zero-centred norms (Qwen3-Next/3.5) run the same kernel (gated_delta_net.FusedZeroCenteredRMSNorm).
- RoPE: Megatron's own hook, `apply_rope_fusion`, calls `rope_utils.fused_apply_rotary_pos_emb` (TE's kernel when TE
  is there); without TE it is None, so install_fused_rope puts ours there (bshd and, for packed sequences, thd).
  It takes frequencies per token too: the VL families' multimodal RoPE (vision_language.py) runs on it.
- SwiGLU: Megatron's own `bias_activation_fusion`, whose bias_swiglu_impl is compiled by megatron.core.jit's
  jit_fuser (torch.compile on torch >= 2.2); the local spec used to turn it off.
The choice of paths is local_kernels_flags.py's; `fusion_config_overrides` says which of Megatron's switches a
built config can take (MLA, interleaved RoPE and non-SwiGLU activations keep the unfused code).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn.functional as F


def rms_norm_math(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) * weight, computed in fp32 and cast back (what torch.nn.RMSNorm computes)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def rope_math(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Non-interleaved RoPE on the first freqs.shape[-1] channels of t (Megatron's _apply_rotary_pos_emb_bshd)."""
    rot_dim = freqs.shape[-1]
    rotated, passed = t[..., :rot_dim], t[..., rot_dim:]
    cos, sin = torch.cos(freqs).to(t.dtype), torch.sin(freqs).to(t.dtype)
    x1, x2 = torch.chunk(rotated, 2, dim=-1)
    return torch.cat((rotated * cos + torch.cat((-x2, x1), dim=-1) * sin, passed), dim=-1)


# Compiled lazily on first call; dynamo marks a dimension dynamic after it changes once (sequence lengths vary).
_rms_norm_fused = torch.compile(rms_norm_math)
_rope_fused = torch.compile(rope_math)


def fused_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """rms_norm_math as one compiled kernel, shared by every norm class (one compilation per shape and dtype)."""
    return _rms_norm_fused(x, weight, eps)


class FusedRMSNorm(torch.nn.Module):
    """torch.nn.RMSNorm's module (parameter `weight`) running one compiled kernel; WrappedTorchNorm's signature."""

    def __init__(
        self,
        config: Any,
        hidden_size: int,
        eps: float = 1e-5,
        persist_layer_norm: bool = False,
        zero_centered_gamma: bool = False,
        normalization: str = "RMSNorm",
    ) -> None:
        super().__init__()
        # The same refusals as WrappedTorchNorm: these would need another weight meaning or a sequence-parallel grad.
        if config.layernorm_zero_centered_gamma or config.sequence_parallel or config.memory_efficient_layer_norm:
            raise ValueError(
                "FusedRMSNorm supports neither zero-centered gamma, sequence parallel nor memory-efficient"
            )
        self.hidden_size = hidden_size
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """RMSNorm of x over its last dimension."""
        return fused_rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        """Shown by print(model)."""
        return f"{self.hidden_size}, eps={self.eps}"


def fused_apply_rotary_pos_emb(
    t: torch.Tensor, freqs: torch.Tensor, transpose_output_memory: bool = False, interleaved: bool = False
) -> torch.Tensor:
    """TE's fused_apply_rotary_pos_emb signature: t [s, b, h, d], freqs [s, 1, 1, d_rot]."""
    if interleaved:  # fusion_config_overrides never turns the fusion on for interleaved RoPE
        raise ValueError("the compiled RoPE is for non-interleaved rotary embeddings")
    return _rope_fused(t, freqs)


def fused_apply_rotary_pos_emb_thd(
    t: torch.Tensor, cu_seqlens: torch.Tensor, freqs: torch.Tensor, cp_size: int = 1, cp_rank: int = 0
) -> torch.Tensor:
    """TE's thd signature: t [tokens, h, d] of packed sequences, each from position 0 (or freqs per token)."""
    if cp_size != 1:
        raise ValueError("the compiled RoPE handles packed sequences without context parallelism only")
    total = t.shape[0]
    positions = torch.arange(total, device=t.device)
    if freqs.shape[0] != total:  # freqs by position, restarting at each sequence (Megatron's second thd case)
        starts = cu_seqlens[:-1].to(positions.device, torch.long)
        lengths = cu_seqlens[1:].to(torch.long) - cu_seqlens[:-1].to(torch.long)
        positions = positions - torch.repeat_interleave(starts, lengths.to(positions.device), output_size=total)
    return _rope_fused(t.unsqueeze(1), freqs[positions]).squeeze(1)


def install_fused_rope() -> None:
    """Put the compiled RoPE where apply_rope_fusion looks for TE's kernels (only where TE left none)."""
    from megatron.core.models.common.embeddings import rope_utils

    if rope_utils.fused_apply_rotary_pos_emb is None:
        rope_utils.fused_apply_rotary_pos_emb = fused_apply_rotary_pos_emb
    if rope_utils.fused_apply_rotary_pos_emb_thd is None:
        rope_utils.fused_apply_rotary_pos_emb_thd = fused_apply_rotary_pos_emb_thd
    # With several rows (the "padded" layout) Megatron runs multimodal RoPE unfused, which is right, and warns
    # to turn the fusion off; one-row micro-batches and THD take the compiled kernel.
    warnings.filterwarnings("ignore", message="apply_rope_fusion does not support mRoPE", category=UserWarning)


def compiled_rope_installed() -> bool:
    """Whether Megatron's RoPE fusion calls this module's compiled RoPE (not Transformer Engine's kernels)."""
    from megatron.core.models.common.embeddings import rope_utils

    return (
        rope_utils.fused_apply_rotary_pos_emb is fused_apply_rotary_pos_emb
        and rope_utils.fused_apply_rotary_pos_emb_thd is fused_apply_rotary_pos_emb_thd
    )


def fusion_config_overrides(config: Any) -> dict[str, Any]:
    """Megatron's fusion switches this built TransformerConfig can take on the local spec (RoPE, SwiGLU)."""
    out: dict[str, Any] = {}
    rope = getattr(config, "position_embedding_type", "rope") in ("rope", "yarn")
    # MLA's fused RoPE is a separate Triton path of Megatron's; interleaved RoPE needs TE >= 2.3.
    if rope and not config.multi_latent_attention and not config.rotary_interleaved:
        install_fused_rope()
        out["apply_rope_fusion"] = True
    swiglu = config.gated_linear_unit and config.activation_func is F.silu
    if swiglu and config.activation_func_clamp_value is None and not config.glu_linear_offset:
        out["bias_activation_fusion"] = True
    return out


def fuse_norms(spec: Any) -> Any:
    """Swap torch.nn.RMSNorm (WrappedTorchNorm with normalization RMSNorm) for FusedRMSNorm in a block spec."""
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    def swap(holder: Any, field: str) -> None:
        value = getattr(holder, field, None)
        if value is WrappedTorchNorm:
            setattr(holder, field, FusedRMSNorm)
        elif isinstance(value, ModuleSpec) and value.module is WrappedTorchNorm:
            value.module = FusedRMSNorm

    swap(spec, "layer_norm")  # the final norm of the block
    for layer in spec.layer_specs:
        sub = layer.submodules
        for field in ("input_layernorm", "pre_mlp_layernorm", "pre_cross_attn_layernorm"):
            swap(sub, field)
        attention = getattr(getattr(sub, "self_attention", None), "submodules", None)
        for field in ("q_layernorm", "k_layernorm", "kv_layernorm"):
            swap(attention, field)
    return spec
