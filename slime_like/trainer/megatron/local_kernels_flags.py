"""Flags choosing the faster kernels of Megatron's local layer spec (no Transformer Engine), and the choice itself.

One scheme, `--local-<what>`, for everything the local spec can swap in when TE is absent:
--local-core-attention: the core attention from torch (varlen / flex / sdpa, torch_attention.py, which makes the
choice); --local-fused-elementwise: RMSNorm (q/k and zero-centred norms included), RoPE and SwiGLU as
torch.compile'd kernels (fused_ops.py); --local-grouped-experts: MoE experts as one torch grouped GEMM per
projection instead of SequentialMLP's per-expert loop (grouped_experts.py). Each is `auto` by default (on with
CUDA, off on the CPU, where compiling costs more than it saves on tiny models); with Transformer Engine none
applies (TE's own modules run). Importing this module is cheap (no torch).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

CHOICES = ("auto", "on", "off")
FLAGS = ("--local-fused-elementwise", "--local-grouped-experts")
CORE_ATTENTION_FLAG = "--local-core-attention"
CORE_ATTENTION_CHOICES = ("auto", "varlen", "flex", "sdpa", "off")


@dataclass(frozen=True)
class LocalKernels:
    """Which faster paths the local layer spec builds."""

    fused_elementwise: bool = False
    grouped_experts: bool = False


def add_local_kernel_arguments(parser: argparse.ArgumentParser) -> None:
    """--local-core-attention, --local-fused-elementwise and --local-grouped-experts."""
    g = parser.add_argument_group("kernels without Transformer Engine (Megatron's local layer spec)")
    g.add_argument(
        CORE_ATTENTION_FLAG,
        default="auto",
        choices=CORE_ATTENTION_CHOICES,
        help="torch's core attention for packed (THD) micro-batches; auto = varlen on CUDA (falling back to flex, "
        "then per-sequence SDPA, call by call), Megatron's local attention on the CPU; off = Megatron's",
    )
    g.add_argument(
        "--local-fused-elementwise",
        default="auto",
        choices=CHOICES,
        help="RMSNorm (q/k and zero-centred norms too), RoPE and SwiGLU fused by torch.compile; auto: on with CUDA, "
        "off on the CPU (on the CPU, `on` needs a C compiler)",
    )
    g.add_argument(
        "--local-grouped-experts",
        default="auto",
        choices=CHOICES,
        help="MoE experts as torch grouped GEMMs instead of a per-expert loop; auto: on with CUDA, off on the CPU",
    )


def _pick(value: str, flag: str, cuda: bool) -> bool:
    if value not in CHOICES:
        raise ValueError(f"{flag} {value!r}: choose one of {', '.join(CHOICES)}")
    return cuda if value == "auto" else value == "on"


def choose_local_kernels(
    fused_elementwise: str = "auto", grouped_experts: str = "auto", *, cuda: bool, transformer_engine: bool
) -> LocalKernels:
    """The paths to build: none with Transformer Engine; otherwise each flag's value (auto: on only with CUDA)."""
    if transformer_engine:
        return LocalKernels()
    return LocalKernels(
        fused_elementwise=_pick(fused_elementwise, FLAGS[0], cuda),
        grouped_experts=_pick(grouped_experts, FLAGS[1], cuda),
    )


def local_kernels_from_args(args: argparse.Namespace, *, cuda: bool, transformer_engine: bool) -> LocalKernels:
    """choose_local_kernels from a parsed command line (flags absent from it count as auto)."""
    return choose_local_kernels(
        getattr(args, "local_fused_elementwise", "auto"),
        getattr(args, "local_grouped_experts", "auto"),
        cuda=cuda,
        transformer_engine=transformer_engine,
    )


def no_effect_local_kernel_flags(args: argparse.Namespace, transformer_engine: bool) -> list[str]:
    """The flags set to `on` that change nothing because Transformer Engine's spec is built."""
    if not transformer_engine:
        return []
    return [f for f in FLAGS if getattr(args, f.removeprefix("--").replace("-", "_"), "auto") == "on"]
