"""Model provider: Megatron GPTModel chunks from a Hugging Face checkpoint through mbridge.

The bridge class comes from the family registry (slime_like.trainer.megatron.families), which also holds the
Megatron <-> HF name maps used to load and export weights (slime_like.trainer.megatron.hf_weights). mbridge
builds the TransformerConfig and the GPTModel; the fixes it needs are made here and in bridges.py:
- transformers 5 configs keep `rope_theta` in `rope_parameters`; mbridge reads `hf_config.rope_theta`.
- mbridge always builds the Transformer Engine layer spec; without CUDA+TE we swap in Megatron's local
  spec (separate layer-norm modules, SequentialMLP experts), whose names the registry maps directly;
  its core attention assumes q/k and v heads of kv_channels, so MLA gets a subclass taking its sizes.
  The local spec cannot run context or sequence parallel: make_bridge refuses them with the flag's name.
  Its core attention can be torch's (varlen / flex / SDPA, torch_attention.py): on CUDA without TE by default,
  on the CPU when `torch_attention` (--local-core-attention) asks; it takes packed (THD) micro-batches.
- mbridge takes the TP/PP/CP/EP sizes from Megatron's parallel state, but turns sequence parallel on
  whenever TP > 1: here it follows --sequence-parallel (init_parallel) instead.
- Family-specific config fixes (Llama 3 rope scaling, DeepSeek-V3 on megatron-core 0.16, GLM): bridges.py; GLM-4's
  sandwich norms (sandwich_norms.py) and MiniMax-M2's all-heads QK norm (all_heads_qk_norm.py) are spec changes made
  on whichever spec is built; Qwen3-Next / Qwen3.5 build their hybrid linear-attention spec themselves, for both
  backends (gated_delta_net.py).
- Multi-token-prediction layers of a checkpoint are built only with --enable-mtp-training (mtp.py); otherwise
  untrained_hf_weights hands their tensors on as stored.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from pathlib import Path

import torch

from slime_like.core.hf_config import load_hf_config
from slime_like.trainer.megatron import hf_weights
from slime_like.trainer.megatron import mtp as mtp_lib
from slime_like.trainer.megatron.bridges import fix_hf_config
from slime_like.trainer.megatron.cpu_compat import (
    ON_CUDA,
    apply_cpu_compat,
    cuda_to_cpu,
    transformer_config_overrides,
    transformer_engine_available,
)
from slime_like.trainer.megatron.families import family_of, rules_for
from slime_like.trainer.megatron.layer_specs import local_layer_spec
from slime_like.trainer.megatron.parallel import check_sequence_parallel, sequence_parallel_enabled
from slime_like.trainer.megatron.torch_attention import choose_attention


def _check_context_parallel(local_spec: bool) -> None:
    """Megatron's local DotProductAttention asserts context_parallel_size == 1: say what to change."""
    from megatron.core import parallel_state as mpu

    cp = mpu.get_context_parallel_world_size()
    if cp > 1 and local_spec:
        raise ValueError(
            f"--context-parallel-size {cp} needs CUDA with Transformer Engine: Megatron's local attention (the "
            "CPU path) refuses context parallelism. Use --context-parallel-size 1, or run on GPUs with "
            "transformer-engine installed"
        )


def make_bridge(
    hf_dir: str | Path,
    dtype: torch.dtype = torch.float32,
    make_vocab_size_divisible_by: int | None = None,
    **config_overrides,
):
    """An mbridge Bridge for the checkpoint in hf_dir (call after init_parallel).

    `make_vocab_size_divisible_by` pads Megatron's vocabulary (padding rows are dropped on export);
    `config_overrides` are extra Megatron TransformerConfig fields (e.g. recompute settings);
    `sequence_parallel` among them overrides init_parallel's choice; `torch_attention` (--local-core-attention:
    auto, varlen, flex, sdpa, off) picks torch's core attention for the local spec (torch_attention.py).
    """
    from megatron.core import parallel_state as mpu

    apply_cpu_compat()
    local_spec = not transformer_engine_available()
    _check_context_parallel(local_spec)
    local_kernels = config_overrides.pop("local_kernels", None)  # a LocalKernels (local_kernels_flags.py) or auto
    tp = mpu.get_tensor_model_parallel_world_size()
    # Off at TP 1 (nothing to split), as init_parallel and Megatron-LM turn it off.
    sequence_parallel = config_overrides.pop("sequence_parallel", sequence_parallel_enabled()) and tp > 1
    torch_attention = config_overrides.pop("torch_attention", None)
    check_sequence_parallel(sequence_parallel, tp)
    hf_config = load_hf_config(hf_dir)
    fix_hf_config(hf_config)
    family = family_of(hf_config)
    bridge = family.bridge(hf_config, dtype=dtype, make_vocab_size_divisible_by=make_vocab_size_divisible_by)
    bridge.slime_like_local_spec = local_spec
    bridge.slime_like_hf_dir = Path(hf_dir)
    # Fused elementwise kernels and grouped experts of the local spec, read by local_layer_spec (fused_ops.py,
    # grouped_experts.py); Megatron's RoPE/SwiGLU fusion switches go into the config unless the caller set them.
    if local_kernels is None:
        from slime_like.trainer.megatron.local_kernels_flags import choose_local_kernels

        local_kernels = choose_local_kernels(cuda=ON_CUDA, transformer_engine=not local_spec)
    bridge.slime_like_local_kernels = local_kernels
    if local_spec and local_kernels.fused_elementwise:
        from slime_like.trainer.megatron.fused_ops import fusion_config_overrides

        config_overrides = {**fusion_config_overrides(bridge.config), **config_overrides}
    if local_spec and not getattr(bridge, "builds_own_layer_spec", False):  # Qwen3-Next builds both specs
        bridge._get_transformer_layer_spec = types.MethodType(local_layer_spec, bridge)
    bridge.set_extra_args(**{**transformer_config_overrides(local_spec, sequence_parallel), **config_overrides})
    # A family building its own spec swaps torch's attention in itself, if it says so (Qwen3-Next / Qwen3.5).
    own_spec = getattr(bridge, "builds_own_layer_spec", False) and not getattr(bridge, "takes_torch_attention", False)
    bridge.slime_like_torch_attention = choose_attention(
        torch_attention,
        ON_CUDA,
        not local_spec,
        softmax_type=getattr(bridge.config, "softmax_type", "vanilla"),
        dropout=float(bridge.config.attention_dropout or 0.0),
        own_spec=own_spec,
    )
    return bridge


def uses_transformer_engine(bridge) -> bool:
    """Whether make_bridge kept mbridge's Transformer Engine layer spec (CUDA with TE installed)."""
    return not bridge.slime_like_local_spec


def torch_attention_path(bridge) -> str | None:
    """The torch core-attention path the local spec uses (varlen, flex, sdpa), or None for Megatron's attention."""
    return getattr(bridge, "slime_like_torch_attention", None)


def takes_packed_sequences(bridge) -> bool:
    """Whether the model's attention takes THD micro-batches (PackedSeqParams): TE's, or torch's."""
    return uses_transformer_engine(bridge) or torch_attention_path(bridge) is not None


def build_model(
    bridge,
    wrap_with_ddp: bool = True,
    use_distributed_optimizer: bool = True,
) -> list[torch.nn.Module]:
    """Build the model chunks of this rank (one per virtual pipeline stage), DDP-wrapped for training.

    The DDP buffers follow the distributed optimizer's needs: grads reduced in fp32, no bucketing
    overlap (the engine syncs grads once per step through finalize_model_grads).
    """
    ddp_config = {
        "grad_reduce_in_fp32": True,
        "use_distributed_optimizer": use_distributed_optimizer,
        "overlap_grad_reduce": False,
        "overlap_param_gather": False,
    }
    with cuda_to_cpu():
        return bridge.get_model(
            wrap_with_ddp=wrap_with_ddp,
            fp16=False,
            bf16=bridge.dtype is torch.bfloat16,
            use_cpu_initialization=not ON_CUDA,
            ddp_config=ddp_config,
        )


def load_hf_weights(bridge, model: list[torch.nn.Module], hf_dir: str | Path) -> None:
    """Copy HF safetensors weights into the model chunks (before the optimizer copies them)."""
    with cuda_to_cpu():
        hf_weights.load_hf_weights(model, hf_dir, bridge.hf_config, bridge.config)


def export_hf_weights(
    bridge, model: list[torch.nn.Module], skip: frozenset[int] = frozenset()
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (hf_name, full tensor) on every rank, gathered across TP, EP and PP (a collective: all ranks
    must iterate to the end); the parameters whose ids are in `skip` left out.

    Tensors may be views of live parameters: consume (or clone) them before the next optimizer step.
    Tied embeddings that exist on two pipeline stages are yielded once.
    """
    weights = hf_weights.export_hf_weights(model, bridge.hf_config, bridge.config, skip)
    while True:
        # Modes are entered per item so that the caller's code between items runs outside them.
        with cuda_to_cpu():
            item = next(weights, None)
        if item is None:
            return
        yield item


def untrained_hf_weights(bridge) -> Iterator[tuple[str, torch.Tensor]]:
    """The HF checkpoint's tensors the model holds no parameter for (multi-token-prediction layers), as stored.

    export_hf_weights followed by these is the complete HF checkpoint; weight updates send only the former
    (a server keeps the MTP draft layers it loaded).
    """
    checkpoint = hf_weights.HFCheckpoint(bridge.slime_like_hf_dir)
    built = getattr(bridge, "slime_like_mtp_layers", 0)  # MTP layers the model holds (mtp.enable_mtp)
    trained = mtp_lib.trained_hf_name_pattern(rules_for(bridge.hf_config), built)
    for name in hf_weights.untrained_hf_names(checkpoint.names(), bridge.hf_config):
        if not (built and trained.fullmatch(name)):
            yield name, checkpoint.get(name, "none (copied unchanged)")
