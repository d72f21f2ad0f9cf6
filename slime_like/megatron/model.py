"""Model provider: Megatron GPTModel chunks from a Hugging Face checkpoint through mbridge.

mbridge (0.15.1) needs three fixes, all made in `make_bridge`:
- transformers 5 configs keep `rope_theta` in `rope_parameters`; mbridge reads `hf_config.rope_theta`.
- mbridge always builds the Transformer Engine layer spec; without CUDA+TE we swap in Megatron's local
  spec, whose layer norms are separate modules (`input_layernorm`, `pre_mlp_layernorm`) instead of
  being fused into the next linear, so they need two extra HF name mappings.
- mbridge's tied-embedding adjustment mutates a class-level mapping shared by every bridge of the
  family; we give each bridge its own copies of the mappings.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import AutoConfig

from slime_like.megatron.cpu_compat import ON_CUDA, apply_cpu_compat, cuda_to_cpu, transformer_config_overrides


def _use_transformer_engine() -> bool:
    if not ON_CUDA:
        return False
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        return False
    return True


def _local_layer_spec(self, vp_stage: int | None = None):
    """Replacement for LLMBridge._get_transformer_layer_spec building Megatron's local spec."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    self.has_vp_stage = True  # read by LLMBridge's provider
    return get_gpt_decoder_block_spec(
        self.config, use_transformer_engine=False, normalization=self.config.normalization, vp_stage=vp_stage
    )


def _fix_hf_config(hf_config) -> None:
    """Expose rope_theta at the top level, where mbridge reads it (transformers 5 moved it)."""
    if getattr(hf_config, "rope_theta", None) is None:
        rope = getattr(hf_config, "rope_parameters", None) or {}
        hf_config.rope_theta = rope.get("rope_theta", 10000.0)


def _own_mappings(bridge, local_spec: bool) -> None:
    """Give the bridge instance private name maps, with the local spec's separate layer norms."""
    tied = getattr(bridge.hf_config, "tie_word_embeddings", False)
    direct = dict(type(bridge)._DIRECT_MAPPING)
    if "output_layer.weight" in direct:
        direct["output_layer.weight"] = "model.embed_tokens.weight" if tied else "lm_head.weight"
    bridge._DIRECT_MAPPING = direct
    bridge._MLP_MAPPING = dict(type(bridge)._MLP_MAPPING)
    bridge._OTHER_MAPPING = dict(type(bridge)._OTHER_MAPPING)
    if local_spec:
        # Names under "mlp" (pre_mlp_layernorm) are looked up in _MLP_MAPPING, the rest in _OTHER_MAPPING.
        bridge._MLP_MAPPING.setdefault(
            "pre_mlp_layernorm.weight", ["model.layers.{layer_number}.post_attention_layernorm.weight"]
        )
        bridge._OTHER_MAPPING.setdefault(
            "input_layernorm.weight", ["model.layers.{layer_number}.input_layernorm.weight"]
        )


def make_bridge(hf_dir: str | Path, dtype: torch.dtype = torch.float32, **config_overrides):
    """An mbridge Bridge for the checkpoint in hf_dir (call after init_parallel).

    `config_overrides` are extra Megatron TransformerConfig fields (e.g. recompute settings).
    """
    from mbridge import AutoBridge

    apply_cpu_compat()
    hf_config = AutoConfig.from_pretrained(str(hf_dir))
    _fix_hf_config(hf_config)
    bridge_cls = _bridge_class(hf_config)
    # LLMBridge.__init__ mutates the class-level _DIRECT_MAPPING for tied models: restore it after.
    cls_direct = dict(bridge_cls._DIRECT_MAPPING)
    try:
        bridge = AutoBridge.from_config(hf_config, dtype=dtype)
    finally:
        bridge_cls._DIRECT_MAPPING.clear()
        bridge_cls._DIRECT_MAPPING.update(cls_direct)
    local_spec = not _use_transformer_engine()
    bridge.slime_like_local_spec = local_spec
    if local_spec:
        bridge._get_transformer_layer_spec = types.MethodType(_local_layer_spec, bridge)
    _own_mappings(bridge, local_spec)
    bridge.set_extra_args(**transformer_config_overrides(local_spec), **config_overrides)
    return bridge


def uses_transformer_engine(bridge) -> bool:
    """Whether make_bridge kept mbridge's Transformer Engine layer spec (CUDA with TE installed)."""
    return not bridge.slime_like_local_spec


def _bridge_class(hf_config):
    from mbridge.core.bridge import _MODEL_REGISTRY

    try:
        return _MODEL_REGISTRY[hf_config.model_type]
    except KeyError:
        raise ValueError(f"mbridge has no bridge for model_type {hf_config.model_type!r}") from None


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
    with cuda_to_cpu(), torch.no_grad():
        bridge.load_weights(model, str(hf_dir))


def export_hf_weights(bridge, model: list[torch.nn.Module]) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (hf_name, full tensor) on every rank, gathered across TP and PP (a collective: all ranks
    must iterate to the end).

    Tensors may be views of live parameters: consume (or clone) them before the next optimizer step.
    Tied embeddings that exist on two pipeline stages are yielded once.
    """
    seen: set[str] = set()
    weights = bridge.export_weights(model)
    while True:
        # Modes are entered per item so that the caller's code between items runs outside them.
        with cuda_to_cpu(), torch.no_grad():
            item = next(weights, None)
        if item is None:
            return
        name, tensor = item
        if name not in seen:
            seen.add(name)
            yield name, tensor.detach()
