"""Load HF safetensors into Megatron model chunks, and export them back as full HF-named tensors.

Names come from the family registry (slime_like.trainer.megatron.families), tensor layouts from
slime_like.trainer.megatron.conversion. Loading needs no communication: every rank reads the tensors of
its own parameters and keeps its TP/EP part. Exporting is collective: each parameter is broadcast
from the pipeline stage that holds it, gathered over tensor (or expert-tensor) parallel ranks and,
for experts, over expert-parallel ranks, so every rank yields every full tensor.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors import safe_open

from slime_like.trainer.megatron.conversion import EXPERT_SLICES, AttentionShape, shard, to_hf, to_megatron, unshard
from slime_like.trainer.megatron.families import Rule, is_vision_name, rules_for, template
from slime_like.trainer.megatron.lora import is_adapter_param
from slime_like.trainer.megatron.stacked_experts import ExpertStacks, read_expert

_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
# MiMo's own place for its MTP layers; Qwen3-Next and Qwen3.5 keep theirs (fc, norms, layers) under mtp. (Qwen3.5's
# vision tower, model.visual, is built: vision_language.py.)
_HF_MTP_LAYER = re.compile(r"^(model\.mtp_layers\.\d+|mtp)\.")


def untrained_hf_names(names: Iterable[str], hf_config: Any) -> list[str]:
    """The checkpoint tensors of the multi-token-prediction layers (model.layers.{n} for n >= num_hidden_layers, or
    MiMo's model.mtp_layers.{i}), which Megatron builds only with --enable-mtp-training (mtp.py); a full export
    of a model without them copies them from the checkpoint."""
    layers = hf_config.num_hidden_layers
    return sorted(
        n for n in names if _HF_MTP_LAYER.match(n) or ((m := _HF_LAYER.match(n)) and int(m.group(1)) >= layers)
    )


class HFCheckpoint:
    """Lazy name -> tensor access to the safetensors of an HF directory (indexed or not)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        index = self.directory / "model.safetensors.index.json"
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
            self.files = {name: self.directory / file for name, file in weight_map.items()}
        else:
            self.files = {}
            for path in sorted(self.directory.glob("*.safetensors")):
                with safe_open(path, "pt") as f:
                    self.files.update(dict.fromkeys(f.keys(), path))
        if not self.files:
            raise FileNotFoundError(f"no safetensors weights in {self.directory}")
        self._open: dict[Path, Any] = {}

    def names(self) -> set[str]:
        """Every tensor name in the checkpoint."""
        return set(self.files)

    def get(self, name: str, wanted_by: str) -> torch.Tensor:
        """One tensor; a KeyError naming the Megatron parameter that needs it if it is absent."""
        return self._open_file(name, wanted_by).get_tensor(name)

    def get_slice(self, name: str, wanted_by: str) -> Any:
        """safetensors' lazy slice of one tensor (indexing it reads only that part), as `get` finds it."""
        return self._open_file(name, wanted_by).get_slice(name)

    def _open_file(self, name: str, wanted_by: str) -> Any:
        if name not in self.files:
            hint = ""
            if name.startswith(("model.layers.", "visual.")) and any(
                n.startswith("model.language_model.") for n in self.files
            ):
                # transformers 4.52-4.57 saved Qwen2.5-VL under its module names; 5.x writes the original ones back.
                hint = (": it stores transformers 4.52-4.57's names (model.language_model.*, model.visual.*); load it "
                        "with transformers 5 and save_pretrained it again, which writes the original names")  # fmt: skip
            raise KeyError(f"{self.directory} has no tensor {name!r} (needed for Megatron parameter {wanted_by}){hint}")
        path = self.files[name]
        if path not in self._open:
            self._open[path] = safe_open(path, "pt")
        return self._open[path]


def _refuse_fp8(tensors: list[torch.Tensor], names: list[str], directory: Path) -> None:
    """A ValueError for FP8 tensors: copied into 16/32-bit parameters they would load without their block scales."""
    for name, tensor in zip(names, tensors, strict=True):
        if tensor.dtype.is_floating_point and tensor.dtype.itemsize == 1:
            raise ValueError(
                f"{directory} stores {name} in {tensor.dtype} (an FP8 checkpoint, as MiniMax-M2's and Kimi-K2's "
                "published weights are): the trainer loads 16/32-bit weights only. Dequantize the checkpoint to bf16 "
                "first (e.g. with slime's tools/fp8_cast_bf16.py) and pass that directory as --hf-checkpoint"
            )


@dataclass
class _Entry:
    """One Megatron parameter (or ruled buffer) of a rank, with its global layer number."""

    name: str
    rule: Rule
    layer: int | None
    expert: int | None  # local expert index on its EP rank
    parallel: bool  # split over the tensor (or, for experts, expert-tensor) parallel group
    dim: int  # the split dimension
    shape: tuple[int, ...]
    dtype: torch.dtype
    tensor: torch.Tensor | None = None  # None in the metadata other pipeline stages receive

    def hf_names(self, expert: int | None) -> list[str]:
        layer = None if self.layer is None else self.layer + self.rule.layer_offset
        return [n.format(layer=layer, expert=expert) for n in self.rule.hf]

    def meta(self) -> _Entry:
        return _Entry(self.name, self.rule, self.layer, self.expert, self.parallel, self.dim, self.shape, self.dtype)


def _unwrap(module: torch.nn.Module) -> torch.nn.Module:
    while hasattr(module, "module"):  # DDP, Float16Module
        module = module.module
    return module


def _entries(chunk: torch.nn.Module, rules: dict[str, Rule]) -> list[_Entry]:
    """Every parameter of a model chunk with a rule (a parameter without one is an error)."""
    chunk = _unwrap(chunk)
    global_layer = {i: layer.layer_number - 1 for i, layer in enumerate(getattr(chunk.decoder, "layers", []))}
    params = {id(p) for p in chunk.parameters()}
    entries = []
    for name, tensor in chunk.state_dict(keep_vars=True).items():
        if name.rsplit(".", 1)[-1] == "_extra_state" or not torch.is_tensor(tensor) or is_adapter_param(name):
            continue  # LoRA adapters are no part of the HF base model (lora.py saves them in PEFT format)
        key, layer, expert = template(name)
        rule = rules.get(key)
        if rule is None:
            if id(tensor) in params:
                raise ValueError(f"Megatron parameter {name} ({key}) has no HF name in this model family's map")
            continue  # a buffer such as the router's token counts
        entries.append(
            _Entry(
                name,
                rule,
                # MTP layers (mtp.layers.{i}) and vision blocks keep their own numbering; decoder layers get their
                # global number.
                layer if layer is None or key.startswith("mtp.") or is_vision_name(key) else global_layer[layer],
                expert,
                bool(getattr(tensor, "tensor_model_parallel", False)),
                getattr(tensor, "partition_dim", 0),
                tuple(tensor.shape),
                tensor.dtype,
                tensor,
            )
        )
    return entries


class _Layout:
    """Parallel sizes, ranks and the shapes the conversions need, for one model."""

    def __init__(self, hf_config: Any, config: Any) -> None:
        from megatron.core import parallel_state as mpu

        self.rules = rules_for(hf_config)
        self.hf_vocab = hf_config.vocab_size
        linear = None
        if getattr(config, "linear_num_key_heads", None):  # gated delta net layers (Qwen3-Next, Qwen3.5)
            linear = (config.linear_num_key_heads, config.linear_num_value_heads, config.linear_key_head_dim,
                      config.linear_value_head_dim)  # fmt: skip
        self.attn = AttentionShape(config.num_attention_heads, config.num_query_groups, config.kv_channels, linear)
        self.tp = (mpu.get_tensor_model_parallel_world_size(), mpu.get_tensor_model_parallel_rank())
        self.etp = (mpu.get_expert_tensor_parallel_world_size(), mpu.get_expert_tensor_parallel_rank())
        self.ep = (mpu.get_expert_model_parallel_world_size(), mpu.get_expert_model_parallel_rank())
        self.pp = (mpu.get_pipeline_model_parallel_world_size(), mpu.get_pipeline_model_parallel_rank())
        self.num_local_experts = (config.num_moe_experts or 0) // self.ep[0]
        self.hidden = config.hidden_size

    def tp_of(self, entry: _Entry) -> tuple[int, int]:
        """(size, rank) of the tensor-parallel group that splits this parameter."""
        if not entry.parallel:
            return 1, 0
        return self.etp if entry.expert is not None else self.tp

    def global_expert(self, local: int, ep_rank: int) -> int:
        return ep_rank * self.num_local_experts + local


def load_hf_weights(model: list[torch.nn.Module], hf_dir: str | Path, hf_config: Any, config: Any) -> None:
    """Copy the HF checkpoint's tensors into this rank's parameters (its TP/EP/PP part)."""
    layout = _Layout(hf_config, config)
    checkpoint = HFCheckpoint(hf_dir)
    with torch.no_grad():
        for chunk in model:
            for entry in _entries(chunk, layout.rules):
                expert = None if entry.expert is None else layout.global_expert(entry.expert, layout.ep[1])
                names = entry.hf_names(expert)
                size, rank = layout.tp_of(entry)
                rows = entry.tensor.shape[0] * size if entry.rule.kind == "vocab" else None
                if entry.rule.kind in EXPERT_SLICES:  # one expert of a stacked tensor (stacked_experts.py)
                    hf = [read_expert(checkpoint, names[0], expert, entry.rule.kind, layout.hidden, entry.name)]
                else:
                    hf = [checkpoint.get(n, entry.name) for n in names]
                _refuse_fp8(hf, names, checkpoint.directory)
                full = to_megatron(entry.rule.kind, hf, layout.attn, rows)
                part = shard(entry.rule.kind, full, entry.dim, size, rank, layout.attn)
                if part.shape != entry.tensor.shape:
                    raise ValueError(
                        f"HF tensors {names} (shapes {[tuple(t.shape) for t in hf]}) do not fit Megatron parameter "
                        f"{entry.name} of shape {tuple(entry.tensor.shape)} at TP size {size}: "
                        "the config does not describe these weights"
                    )
                entry.tensor.copy_(part)


def _gather(tensor: torch.Tensor, size: int, group: Any) -> list[torch.Tensor]:
    if size == 1:
        return [tensor]
    parts = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return parts


def export_hf_weights(
    model: list[torch.nn.Module], hf_config: Any, config: Any, skip: frozenset[int] = frozenset()
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, full tensor) on every rank; collective, so every rank must iterate to the end.

    Tensors may be views of live parameters (TP=PP=EP=1): consume or clone them before they change.
    A tensor two parameters map to (the tied embedding on two pipeline stages) is yielded once.
    `skip`: ids of parameters left out (every rank of a TP / EP group must leave out the same ones).
    """
    from megatron.core import parallel_state as mpu

    layout = _Layout(hf_config, config)
    local = [e for chunk in model for e in _entries(chunk, layout.rules) if id(e.tensor) not in skip]
    pp_size, pp_rank = layout.pp
    stages: list[Any] = [[e.meta() for e in local]]
    if pp_size > 1:
        stages = [None] * pp_size
        dist.all_gather_object(stages, [e.meta() for e in local], group=mpu.get_pipeline_model_parallel_group())
    device = next(p.device for chunk in model for p in chunk.parameters())  # `skip` may leave a stage none
    mine = iter(local)
    seen: set[str] = set()
    stacks = ExpertStacks(layout.num_local_experts * layout.ep[0])  # stacked experts tensors (stacked_experts.py)
    with torch.no_grad():
        for stage, entries in enumerate(stages):
            for entry in entries:
                if stage == pp_rank:
                    tensor = next(mine).tensor.detach()
                else:
                    tensor = torch.empty(entry.shape, dtype=entry.dtype, device=device)
                if pp_size > 1:
                    dist.broadcast(tensor, group=mpu.get_pipeline_model_parallel_group(), group_src=stage)
                for name, expert, value in _full_hf_tensors(entry, tensor, layout):
                    value = stacks.add(entry.rule.kind, name, expert, value)
                    if value is not None and name not in seen:
                        seen.add(name)
                        yield name, value
    stacks.check_complete()


def _full_hf_tensors(
    entry: _Entry, tensor: torch.Tensor, layout: _Layout
) -> Iterator[tuple[str, int | None, torch.Tensor]]:
    """Gather one parameter over TP (or expert TP) and, for experts, EP; convert it to (HF name, expert, tensor)."""
    from megatron.core import parallel_state as mpu

    kind = entry.rule.kind
    size, _ = layout.tp_of(entry)
    group = (
        mpu.get_expert_tensor_parallel_group() if entry.expert is not None else mpu.get_tensor_model_parallel_group()
    )
    full = unshard(kind, _gather(tensor, size, group), entry.dim, layout.attn)
    if entry.expert is None:
        experts = [(None, full)]
    else:
        ep_size = layout.ep[0]
        gathered = _gather(full, ep_size, mpu.get_expert_model_parallel_group())
        experts = [(layout.global_expert(entry.expert, r), t) for r, t in enumerate(gathered)]
    for expert, value in experts:
        for name, hf in zip(entry.hf_names(expert), to_hf(kind, value, layout.attn, layout.hf_vocab), strict=True):
            yield name, expert, hf
