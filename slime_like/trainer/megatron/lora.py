"""LoRA adapters on Megatron's parallel linear layers, saved and loaded in Hugging Face PEFT format.

Each adapted layer (linear_qkv, linear_proj, linear_fc1, linear_fc2 of every decoder layer) gets a child module
`lora` holding A [rank, in] and B [out, rank]; a forward hook adds scale * B(A(dropout(x))) to the layer's
output, scale = alpha / rank (PEFT's). B starts at zero, so a new adapter leaves the model's outputs unchanged.
Base parameters are frozen (requires_grad False): Megatron's DDP gives them no gradient buffer and its optimizer
no state, so training and optimizer memory cover the adapters only.

Tensor parallel: A and B are split like the layer they adapt. Column-parallel layers (qkv, fc1) split B by
output rows and keep A whole; the low-rank activation A x enters the TP region with Megatron's
copy_to_tensor_model_parallel_region, so A's gradient is summed over TP ranks as the input's is. Row-parallel
layers (proj, fc2) split A by input columns and keep B whole; the partial A x is summed over TP ranks first.

Megatron fuses q/k/v into linear_qkv and gate/up into linear_fc1: in PEFT format each of q_proj, k_proj, v_proj
(gate_proj, up_proj) gets the shared A and its rows of B, which is the same update. An adapter whose q/k/v (or
gate/up) A matrices differ cannot be fused back and is refused on load.

Supported here: dense decoder layers with Megatron's local layer spec (the CPU path), TP >= 1, PP = 1, no
sequence parallel; MoE experts and MLA projections are not adapted yet (a clear error says so).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from slime_like.trainer.megatron.lora_flags import TARGET_PATHS

logger = logging.getLogger(__name__)

ADAPTER_MODULE = "lora"  # the child module of an adapted layer: parameters `<layer>.lora.A` and `<layer>.lora.B`
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # what PEFT puts before the HF module names in its saved keys

ROW_PARALLEL = ("linear_proj", "linear_fc2")  # split over TP by input columns; the others by output rows


@dataclass(frozen=True)
class LoraSettings:
    """What an adapter is: rank, alpha (scale = alpha / rank), dropout, the Megatron layers it adapts, init seed."""

    rank: int
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = tuple(TARGET_PATHS)
    seed: int = 1234

    @property
    def scale(self) -> float:
        """PEFT's scaling of B A (not rsLoRA's)."""
        return self.alpha / self.rank


def lora_settings(args: Any) -> LoraSettings | None:
    """The policy engine's LoraSettings from the flags (lora_flags.py); None without --lora-rank."""
    if not getattr(args, "lora_rank", 0):
        return None
    return LoraSettings(args.lora_rank, args.lora_alpha, args.lora_dropout, tuple(args.lora_targets), args.seed)


def is_adapter_param(name: str) -> bool:
    """Whether a Megatron parameter name belongs to a LoRA adapter (not to the base model)."""
    return f".{ADAPTER_MODULE}." in name


class LoraAdapter(torch.nn.Module):
    """The low-rank update of one parallel linear layer: scale * B(A(dropout(x))), split over TP like the layer."""

    def __init__(self, base: torch.nn.Module, settings: LoraSettings, row_parallel: bool, seed: int) -> None:
        super().__init__()
        from megatron.core.tensor_parallel import set_tensor_model_parallel_attributes

        self.row_parallel = row_parallel
        self.scale = settings.scale
        self.tp_group = base.tp_group
        tp_size, tp_rank = self.tp_group.size(), self.tp_group.rank()
        out_local, in_local = base.weight.shape
        weight = base.weight
        # A is drawn whole from a seed of its own (PEFT's kaiming-uniform bound), then split: every TP layout and
        # every DP rank starts from the same adapter.
        fan_in = in_local * tp_size if row_parallel else in_local
        g = torch.Generator().manual_seed(seed)
        a_full = (torch.rand(settings.rank, fan_in, generator=g) * 2 - 1) / math.sqrt(fan_in)
        a = a_full.chunk(tp_size, dim=1)[tp_rank] if row_parallel else a_full
        self.A = torch.nn.Parameter(a.to(device=weight.device, dtype=weight.dtype).contiguous())
        self.B = torch.nn.Parameter(torch.zeros(out_local, settings.rank, device=weight.device, dtype=weight.dtype))
        split, dim = (self.A, 1) if row_parallel else (self.B, 0)
        set_tensor_model_parallel_attributes(split, True, dim, 1)
        self.dropout = torch.nn.Dropout(settings.dropout) if settings.dropout else torch.nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The update to add to the base layer's output for input x."""
        from megatron.core.tensor_parallel import (
            copy_to_tensor_model_parallel_region,
            reduce_from_tensor_model_parallel_region,
        )

        low = torch.nn.functional.linear(self.dropout(x), self.A)
        if self.tp_group.size() > 1:
            region = (
                reduce_from_tensor_model_parallel_region if self.row_parallel else copy_to_tensor_model_parallel_region
            )
            low = region(low, group=self.tp_group)
        return torch.nn.functional.linear(low, self.B) * self.scale


def _add_update(module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
    """Forward hook of an adapted layer: its (output, bias) with the adapter's update added to the output."""
    x = args[0] if args else kwargs["input_"]
    out, bias = output
    return out + module.lora(x), bias


def _sharded_state_dict(layer: torch.nn.Module, gated: bool):
    """The layer's sharded_state_dict with its split adapter tensor marked split (Megatron's marks it replicated);
    a gated fc1's B holds a part of the gate and a part of the up rows, saved as two halves as Megatron saves fc1."""
    original = layer.sharded_state_dict

    def sharded_state_dict(prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None) -> dict:
        from megatron.core.transformer.mlp import apply_swiglu_sharded_factory
        from megatron.core.utils import make_tp_sharded_tensor_for_checkpoint

        out = original(prefix, sharded_offsets, metadata)
        for name, param in layer.lora.named_parameters():
            if getattr(param, "tensor_model_parallel", False):
                key = f"{prefix}{ADAPTER_MODULE}.{name}"
                out[key] = make_tp_sharded_tensor_for_checkpoint(
                    param,
                    key,
                    param.partition_dim,
                    prepend_offsets=sharded_offsets,
                    tp_group=layer.tp_group,
                    dp_cp_group=(metadata or {}).get("dp_cp_group"),
                )
                if gated:
                    singleton = (metadata or {}).get("singleton_local_shards", False)
                    out[key] = apply_swiglu_sharded_factory(out[key], sharded_offsets, singleton)
        return out

    return sharded_state_dict


def _seed(base_seed: int, layer: int, target: str) -> int:
    """A stable per-(layer, target) seed, the same on every rank."""
    return int.from_bytes(hashlib.sha256(f"{base_seed}/{layer}/{target}".encode()).digest()[:8], "little") >> 1


def check_supported(
    pp_size: int, sequence_parallel: bool, transformer_engine: bool, tp_size: int, dropout: float
) -> None:
    """Refuse the layouts this LoRA cannot run yet, naming the flag to change."""
    if transformer_engine:
        raise ValueError(
            "LoRA (--lora-rank) adapts Megatron's local-spec linear layers; with Transformer Engine the qkv and fc1 "
            "layers fuse their layer norm, which the adapter does not see yet. Run without transformer-engine"
        )
    if pp_size > 1:
        raise ValueError("LoRA (--lora-rank) runs with --pipeline-model-parallel-size 1 in this version")
    if sequence_parallel:
        raise ValueError("LoRA (--lora-rank) does not support --sequence-parallel yet: drop the flag")
    if tp_size > 1 and dropout:
        raise ValueError(
            f"--lora-dropout {dropout} with --tensor-model-parallel-size {tp_size}: the TP ranks would drop different "
            "inputs of the same replicated adapter; use --lora-dropout 0 (the usual value for RL)"
        )


def add_adapters(model: torch.nn.Module, settings: LoraSettings) -> int:
    """Add adapters to one (unwrapped) GPTModel chunk and freeze everything else; returns the adapted layers."""
    for param in model.parameters():
        param.requires_grad = False
    adapted = 0
    for layer in model.decoder.layers:
        number = layer.layer_number - 1
        for target in settings.targets:
            path = TARGET_PATHS[target]
            try:
                linear = layer.get_submodule(path)
            except AttributeError:
                linear = None
            if linear is None or not hasattr(linear, "weight"):
                raise ValueError(_missing(layer, target, number))
            if getattr(linear, "gather_output", False):
                raise ValueError(f"LoRA: {path} of layer {number} gathers its output over TP; this is not supported")
            linear.lora = LoraAdapter(linear, settings, target in ROW_PARALLEL, _seed(settings.seed, number, target))
            linear.register_forward_hook(_add_update, with_kwargs=True)
            gated = target == "linear_fc1" and bool(getattr(linear.config, "gated_linear_unit", False))
            linear.sharded_state_dict = _sharded_state_dict(linear, gated)
            adapted += 1
    return adapted


def _missing(layer: torch.nn.Module, target: str, number: int) -> str:
    """Why a target is absent from a decoder layer, and what to target instead."""
    if target in ("linear_fc1", "linear_fc2") and hasattr(layer.mlp, "experts"):
        return (
            f"--target-modules {target}: layer {number} is a mixture-of-experts layer; LoRA on experts is not "
            "supported yet: target the attention only (--target-modules linear_qkv,linear_proj)"
        )
    if target == "linear_qkv":
        return (
            f"--target-modules linear_qkv: layer {number} has no fused qkv projection (multi-latent attention); "
            "LoRA on MLA projections is not supported yet"
        )
    return f"--target-modules {target}: layer {number} has no {TARGET_PATHS[target]}"


def lora_callback(settings: LoraSettings):
    """An mbridge post-creation callback adding the adapters (before DDP wraps the model)."""

    def callback(model: torch.nn.Module, pre_process: bool, post_process: bool, config: Any, hf_config: Any) -> None:
        adapted = add_adapters(model, settings)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in model.parameters())
        logger.info(
            "LoRA rank %d alpha %g on %s (%d layers): %d trainable of %d parameters on this rank (%.2f%%)",
            settings.rank, settings.alpha, ",".join(settings.targets), adapted, trainable, total,
            100.0 * trainable / max(total, 1),
        )  # fmt: skip

    return callback


def _unwrap(module: torch.nn.Module) -> torch.nn.Module:
    while hasattr(module, "module"):  # DDP, Float16Module
        module = module.module
    return module


def _adapted(model: list[torch.nn.Module]) -> Iterator[tuple[int, str, torch.nn.Module]]:
    """(global layer, target, layer module) of every adapted layer of this rank, in order."""
    for chunk in model:
        for layer in _unwrap(chunk).decoder.layers:
            for target, path in TARGET_PATHS.items():
                linear = layer.get_submodule(path) if _has(layer, path) else None
                if linear is not None and hasattr(linear, ADAPTER_MODULE):
                    yield layer.layer_number - 1, target, linear


def _has(module: torch.nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
        return True
    except AttributeError:
        return False


def _gather(tensor: torch.Tensor, group: Any) -> list[torch.Tensor]:
    """Every TP rank's part of a split adapter tensor."""
    if group.size() == 1:
        return [tensor]
    parts = [torch.empty_like(tensor) for _ in range(group.size())]
    torch.distributed.all_gather(parts, tensor.contiguous(), group=group)
    return parts


class _Names:
    """HF names and fused layouts of the adapted layers, from the family's name map."""

    def __init__(self, hf_config: Any, config: Any) -> None:
        from slime_like.trainer.megatron.conversion import AttentionShape
        from slime_like.trainer.megatron.families import rules_for

        self.rules = rules_for(hf_config)
        self.attn = AttentionShape(config.num_attention_heads, config.num_query_groups, config.kv_channels)

    def hf_modules(self, layer: int, target: str) -> tuple[str, list[str]]:
        """(conversion kind, HF module names without `.weight`) of one adapted layer."""
        rule = self.rules[f"decoder.layers.{{layer}}.{TARGET_PATHS[target]}.weight"]
        return rule.kind, [name.format(layer=layer).removesuffix(".weight") for name in rule.hf]


def export_adapter(model: list[torch.nn.Module], hf_config: Any, config: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (PEFT key, full tensor) of every adapter on every rank (a collective: gathers over TP)."""
    from slime_like.trainer.megatron.conversion import to_hf, unshard

    names = _Names(hf_config, config)
    with torch.no_grad():
        for layer, target, linear in _adapted(model):
            lora = linear.lora
            kind, modules = names.hf_modules(layer, target)
            a, b = lora.A.detach(), lora.B.detach()
            if lora.row_parallel:
                a = unshard("copy", _gather(a, lora.tp_group), 1)
            else:
                b = unshard(kind, _gather(b, lora.tp_group), 0)  # gate_up shards hold a part of each half
            for module, b_part in zip(modules, to_hf(kind, b, names.attn), strict=True):
                yield f"{PEFT_PREFIX}{module}.lora_A.weight", a
                yield f"{PEFT_PREFIX}{module}.lora_B.weight", b_part


def adapter_config(settings: LoraSettings, base_model: str, modules: list[str]) -> dict[str, Any]:
    """adapter_config.json of a PEFT LoRA adapter with these settings on these HF module leaf names."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": settings.rank,
        "lora_alpha": settings.alpha,
        "lora_dropout": settings.dropout,
        "target_modules": modules,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "init_lora_weights": True,
        "inference_mode": True,
    }


def save_adapter(
    model: list[torch.nn.Module], hf_config: Any, config: Any, settings: LoraSettings, directory: str | Path, base: str
) -> Path | None:
    """Write the adapter as adapter_config.json + adapter_model.safetensors (PEFT's format) into directory.

    A collective: every rank must call it; rank 0 writes. Returns the directory on rank 0, None elsewhere."""
    tensors = dict(export_adapter(model, hf_config, config))
    if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
        return None
    return write_adapter(directory, tensors, settings, base)


def write_adapter(directory: str | Path, tensors: dict[str, torch.Tensor], settings: LoraSettings, base: str) -> Path:
    """Write PEFT-keyed adapter tensors and their adapter_config.json into directory."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # Copies: q/k/v (gate/up) share one A, and safetensors refuses tensors that share memory.
    tensors = {key: t.detach().to("cpu", copy=True).contiguous() for key, t in tensors.items()}
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    modules = sorted({key.split(".")[-3] for key in tensors})  # "...self_attn.q_proj.lora_A.weight" -> q_proj
    (directory / CONFIG_FILE).write_text(json.dumps(adapter_config(settings, base, modules), indent=2))
    return directory


def merge_scale(peft_config: dict[str, Any], source: str) -> float:
    """The factor PEFT applies to B A for this adapter config (alpha / r, rsLoRA: alpha / sqrt(r)); refuses the
    variants a plain W + scale * B A merge does not reproduce."""
    if peft_config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{source}: peft_type {peft_config.get('peft_type')!r}, not a LoRA adapter")
    unsupported = {
        "use_dora": "DoRA (use_dora)",
        "rank_pattern": "per-module ranks (rank_pattern)",
        "alpha_pattern": "per-module alphas (alpha_pattern)",
        "fan_in_fan_out": "fan_in_fan_out (Conv1D layers)",
    }
    for key, what in unsupported.items():
        if peft_config.get(key):
            raise ValueError(f"{source}: {what} is not supported; merge it with peft's merge_and_unload() instead")
    rank, alpha = int(peft_config["r"]), float(peft_config["lora_alpha"])
    return alpha / math.sqrt(rank) if peft_config.get("use_rslora") else alpha / rank


def merge_adapter(
    named_weights: Iterable[tuple[str, torch.Tensor]], adapter: dict[str, torch.Tensor], scale: float, source: str
) -> Iterator[tuple[str, torch.Tensor]]:
    """HF weights with a LoRA adapter (keys as read_adapter gives them) merged in: W + scale * B A, computed in
    fp32 and cast back to W's dtype. Raises naming the adapter tensors no weight took (another base model?)."""
    modules = {k.removesuffix(".lora_A.weight") for k in adapter if k.endswith(".lora_A.weight")}
    other = sorted(k for k in adapter if not k.endswith((".lora_A.weight", ".lora_B.weight")))
    if other:  # lora_embedding_A/B, DoRA magnitudes, trained biases: not a plain linear update
        raise ValueError(f"{source}: adapter tensors that are no linear LoRA update: {', '.join(other[:4])}")
    merged: set[str] = set()
    for name, weight in named_weights:
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and module in modules:
            a, b = adapter[f"{module}.lora_A.weight"].float(), adapter[f"{module}.lora_B.weight"].float()
            weight = (weight.float() + scale * (b @ a)).to(weight.dtype)
            merged.add(module)
        yield name, weight
    missing = sorted(modules - merged)
    if missing:
        raise ValueError(
            f"{source}: the base model has no weight for adapter module(s) {', '.join(missing[:4])}: is the adapter "
            "for another base model?"
        )


def read_adapter(directory: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A PEFT adapter's config and tensors (keys without PEFT's prefix), or a clear error naming what is missing."""
    from safetensors.torch import load_file

    directory = Path(directory)
    config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    for path in (config_path, weights_path):
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} is missing: a LoRA adapter in PEFT format needs {CONFIG_FILE} and {WEIGHTS_FILE}"
            )
    config = json.loads(config_path.read_text())
    tensors = {k.removeprefix(PEFT_PREFIX): v for k, v in load_file(str(weights_path)).items()}
    # PEFT saves without the adapter name, but some writers keep it (".lora_A.default.weight").
    tensors = {k.replace(".default.weight", ".weight"): v for k, v in tensors.items()}
    return config, tensors


def load_adapter(
    model: list[torch.nn.Module], hf_config: Any, config: Any, settings: LoraSettings, directory: str | Path
) -> None:
    """Set this rank's adapters from a PEFT adapter directory (made by save_adapter or by PEFT)."""
    from slime_like.trainer.megatron.conversion import shard, to_megatron

    peft_config, tensors = read_adapter(directory)
    rank, alpha = peft_config.get("r"), peft_config.get("lora_alpha")
    if rank != settings.rank or not math.isclose(float(alpha), settings.alpha) or peft_config.get("use_rslora"):
        raise ValueError(
            f"{directory}: adapter of rank {rank}, alpha {alpha}{' (rsLoRA)' if peft_config.get('use_rslora') else ''} "
            f"does not match --lora-rank {settings.rank} --lora-alpha {settings.alpha:g}"
        )
    names = _Names(hf_config, config)
    with torch.no_grad():
        for layer, target, linear in _adapted(model):
            lora = linear.lora
            kind, modules = names.hf_modules(layer, target)
            try:
                a_parts = [tensors[f"{m}.lora_A.weight"] for m in modules]
                b_parts = [tensors[f"{m}.lora_B.weight"] for m in modules]
            except KeyError as exc:
                raise ValueError(f"{directory}: no adapter tensor {exc.args[0]} for layer {layer} {target}") from exc
            if any(not torch.equal(a_parts[0], a) for a in a_parts[1:]):
                raise ValueError(
                    f"{directory}: {', '.join(modules)} have different lora_A matrices; Megatron fuses them into "
                    f"{target}, which holds one A: merge this adapter into the base model instead"
                )
            tp, tp_rank = lora.tp_group.size(), lora.tp_group.rank()
            a = a_parts[0].chunk(tp, dim=1)[tp_rank] if lora.row_parallel else a_parts[0]
            b = to_megatron(kind, b_parts, names.attn)
            b = b if lora.row_parallel else shard(kind, b, 0, tp, tp_rank)
            for param, value in ((lora.A, a), (lora.B, b)):
                if param.shape != value.shape:
                    raise ValueError(
                        f"{directory}: layer {layer} {target} adapter shape {tuple(value.shape)} does not fit "
                        f"{tuple(param.shape)} (another base model or rank?)"
                    )
                param.copy_(value)
