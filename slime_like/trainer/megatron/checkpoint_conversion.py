"""What the checkpoint tools share: checks of arguments against the HF config, and writing HF directories.

tools/convert_hf_to_torch_dist.py and tools/convert_torch_dist_to_hf.py are thin CLIs over this module.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slime_like.core.hf_config import hf_field, hf_field_named

if TYPE_CHECKING:  # torch is imported by the functions that need it: the tools' --help stays instant
    import torch

# Files of an HF directory that hold weights; everything else (config, tokenizer, templates) is copied.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5")
_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


class ConversionError(ValueError):
    """Arguments, config and checkpoint that do not describe the same model."""


def add_parallel_arguments(parser: argparse.ArgumentParser) -> None:
    """Megatron's parallel-layout flags the tools take (the process count is torchrun's)."""
    g = parser.add_argument_group("parallel layout")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1)
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    g.add_argument("--expert-model-parallel-size", type=int, default=1)
    g.add_argument("--expert-tensor-parallel-size", type=int, default=None, help="default: the TP size")
    g.add_argument(
        "--make-vocab-size-divisible-by", type=int, default=None, help="pad Megatron's vocabulary (default: none)"
    )
    g.add_argument("--bf16", action="store_true", help="build the model in bf16 (default fp32)")


def add_mtp_arguments(parser: argparse.ArgumentParser) -> None:
    """--mtp-num-layers, as in slime's model files: the torch_dist checkpoint holds the MTP layers then."""
    from slime_like.trainer.megatron.flags import MTP_TRAINED_FAMILIES

    parser.add_argument(
        "--mtp-num-layers",
        type=int,
        default=None,
        help=f"the HF config's num_nextn_predict_layers: for {', '.join(MTP_TRAINED_FAMILIES)} the MTP layers are "
        "built and converted (--enable-mtp-training trains them); for other families they pass through unchanged",
    )


def mtp_layers_to_build(hf_config: Any, mtp_num_layers: int | None) -> int:
    """How many MTP layers the tools build: the given count where the engine trains this family's MTP layers."""
    from slime_like.trainer.megatron.flags import MTP_TRAINED_FAMILIES

    trained = getattr(hf_config, "model_type", None) in MTP_TRAINED_FAMILIES
    return (mtp_num_layers or 0) if trained else 0


def layout_problems(args: argparse.Namespace, hf_config: Any, world_size: int) -> list[str]:
    """One message per parallel size the HF config (outer or nested) or the process count cannot take."""
    tp, pp, ep = args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.expert_model_parallel_size
    problems = []
    if world_size % (tp * pp):
        problems.append(
            f"--tensor-model-parallel-size {tp} x --pipeline-model-parallel-size {pp} does not divide the "
            f"{world_size} processes torchrun started (--nproc_per_node)"
        )
    checks = [
        ("num_attention_heads", "--tensor-model-parallel-size", tp),
        ("num_key_value_heads", "--tensor-model-parallel-size", tp),
        ("num_hidden_layers", "--pipeline-model-parallel-size", pp),
    ]
    for field, flag, size in checks:
        value = hf_field(hf_config, field)
        if value is not None and value % size:
            problems.append(f"{field}={value} in the HF config is not divisible by {flag} {size}")
    experts_field, experts = hf_field_named(hf_config, "num_experts")
    if ep > 1 and not experts:
        problems.append(f"--expert-model-parallel-size {ep} but the HF config has no experts")
    elif experts and experts % ep:
        problems.append(
            f"the HF config's {experts} experts ({experts_field}) are not divisible by --expert-model-parallel-size {ep}"
        )
    vocab_size = hf_field(hf_config, "vocab_size")
    if (args.make_vocab_size_divisible_by or vocab_size) % tp:
        problems.append(
            f"vocab_size={vocab_size} in the HF config is not divisible by --tensor-model-parallel-size "
            f"{tp}: pass --make-vocab-size-divisible-by (a multiple of {tp})"
        )
    return problems


def check_arguments(args: argparse.Namespace, hf_config: Any, world_size: int) -> None:
    """Raise ConversionError listing every architecture flag or parallel size that contradicts the HF config."""
    from slime_like.trainer.model_arguments import check_against_hf_config

    problems = check_against_hf_config(args, hf_config) + layout_problems(args, hf_config, world_size)
    if problems:
        raise ConversionError("the Megatron arguments do not match the HF config:\n  " + "\n  ".join(problems))


def prepare_model(args: argparse.Namespace, tool: str, mtp_layers: int = 0, lora: Any = None) -> tuple[Any, list, bool]:
    """Check the tool's arguments (exit naming the problem), start the parallel world, build the model unwrapped
    (with `mtp_layers` MTP layers: slime_like/trainer/megatron/mtp.py; with `lora`, a LoraSettings, LoRA adapters).

    Returns the bridge, the model chunks, and whether this call created the parallel state (so the tool
    tears it down again; a caller's world of the same sizes is left alone).
    """
    import os
    import sys

    import torch
    from megatron.core import parallel_state

    from slime_like.core.hf_config import load_hf_config
    from slime_like.trainer.megatron.model import build_model, make_bridge
    from slime_like.trainer.megatron.parallel import init_parallel

    try:
        check_arguments(args, load_hf_config(args.hf_checkpoint), int(os.environ.get("WORLD_SIZE", "1")))
    except ConversionError as exc:
        sys.exit(f"{tool}: {exc}")
    ours = not parallel_state.model_parallel_is_initialized()
    init_parallel(
        args.tensor_model_parallel_size,
        args.pipeline_model_parallel_size,
        args.expert_model_parallel_size,
        args.expert_tensor_parallel_size,
    )
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    bridge = make_bridge(args.hf_checkpoint, dtype, args.make_vocab_size_divisible_by)
    if mtp_layers:
        from slime_like.trainer.megatron.mtp import enable_mtp

        try:
            enable_mtp(bridge, mtp_layers, 0.2)  # the loss factor plays no part in a conversion
        except ValueError as exc:
            sys.exit(f"{tool}: {exc}")
    if lora is not None:  # a LoRA run's checkpoint holds adapters next to the frozen base (lora.py)
        from functools import partial

        from slime_like.trainer.megatron.lora import check_supported, lora_callback
        from slime_like.trainer.megatron.model import uses_transformer_engine

        try:
            pp, tp = args.pipeline_model_parallel_size, args.tensor_model_parallel_size
            check_supported(pp, False, uses_transformer_engine(bridge), tp, 0.0)
        except ValueError as exc:
            sys.exit(f"{tool}: the checkpoint holds LoRA adapters: {exc}")
        bridge.get_model = partial(bridge.get_model, post_model_creation_callbacks=[lora_callback(lora)])
    return bridge, build_model(bridge, wrap_with_ddp=False), ours


def checkpoint_shape_problems(directory: str | Path, sharded_state: dict) -> list[str]:
    """Model tensors whose global shape in the torch_dist checkpoint differs from the model's (or are missing)."""
    from megatron.core.dist_checkpointing import load_tensors_metadata
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    stored = load_tensors_metadata(str(directory))
    problems = []
    for key, value in _sharded_tensors(sharded_state):
        if not isinstance(value, ShardedTensor):
            continue
        if key not in stored:
            problems.append(f"{key} is not in the checkpoint")
        elif tuple(stored[key].global_shape) != tuple(value.global_shape):
            problems.append(
                f"{key}: the checkpoint has shape {tuple(stored[key].global_shape)}, the model built from the HF "
                f"config {tuple(value.global_shape)}"
            )
    return problems


def _sharded_tensors(state: Any) -> Iterable[tuple[str, Any]]:
    if isinstance(state, dict):
        for value in state.values():
            yield from _sharded_tensors(value)
    elif isinstance(state, list):
        for value in state:
            yield from _sharded_tensors(value)
    elif hasattr(state, "key"):
        yield state.key, state


def copy_model_files(source: str | Path, target: str | Path) -> None:
    """Copy an HF directory's non-weight files (config, tokenizer, chat template, generation config)."""
    source, target = Path(source), Path(target)
    for path in source.iterdir():
        if path.is_file() and not path.name.endswith(_WEIGHT_SUFFIXES) and path.name not in _WEIGHT_INDEXES:
            shutil.copy(path, target / path.name)


def write_safetensors(
    named_tensors: Iterable[tuple[str, torch.Tensor]], target: str | Path, max_shard_bytes: int = 5 * 1024**3
) -> list[Path]:
    """Write tensors as HF safetensors shards (with an index when there are several); return the files."""
    from safetensors.torch import save_file

    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        # A copy: exported tensors may be views of live parameters or of one fused tensor.
        shards[-1][name] = tensor.detach().to("cpu", copy=True).contiguous()
        size += nbytes
    if len(shards) == 1:
        names = ["model.safetensors"]
    else:
        names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {}
    for name, shard in zip(names, shards, strict=True):
        save_file(shard, target / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
    if len(shards) > 1:
        total = sum(t.numel() * t.element_size() for s in shards for t in s.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (target / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True))
    return [target / n for n in names]


def set_config_dtype(target: str | Path, dtype: torch.dtype) -> None:
    """Record the weights' dtype in the copied config.json (a bf16 model written from an fp32 original)."""
    path = Path(target) / "config.json"
    config = json.loads(path.read_text())
    name = str(dtype).removeprefix("torch.")
    key = "dtype" if "dtype" in config or "torch_dtype" not in config else "torch_dtype"
    if config.get(key) != name:
        config[key] = name
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
