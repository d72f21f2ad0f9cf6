"""LoRA flags (miles' names: --lora-rank, --lora-alpha, --lora-dropout, --target-modules, --lora-adapter-path).

A positive --lora-rank trains LoRA adapters on the policy's linear layers (slime_like/trainer/megatron/lora.py) with the
base frozen. The SGLang servers serve the base with LoRA enabled, and each weight update loads the new adapter
(slime_like/trainer/weights/lora.py) instead of the full weights. Importing this module is cheap (no torch).
"""

from __future__ import annotations

import argparse
import os

from slime_like.trainer.megatron.multi_lora_flags import add_multi_lora_arguments

# Where each Megatron target sits in a decoder layer.
TARGET_PATHS = {
    "linear_qkv": "self_attention.linear_qkv",
    "linear_proj": "self_attention.linear_proj",
    "linear_fc1": "mlp.linear_fc1",
    "linear_fc2": "mlp.linear_fc2",
}
# HF leaf names (slime/miles take either kind in --target-modules) -> the Megatron layer they are part of.
HF_TARGETS = {
    "q_proj": "linear_qkv",
    "k_proj": "linear_qkv",
    "v_proj": "linear_qkv",
    "o_proj": "linear_proj",
    "gate_proj": "linear_fc1",
    "up_proj": "linear_fc1",
    "down_proj": "linear_fc2",
}
ALL_LINEAR = "all-linear"


def resolve_targets(spec: str) -> tuple[str, ...]:
    """The Megatron layers a --target-modules value names: `all-linear`, Megatron names or HF names, comma-separated."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if names == [ALL_LINEAR]:
        return tuple(TARGET_PATHS)
    targets: list[str] = []
    for name in names:
        target = name if name in TARGET_PATHS else HF_TARGETS.get(name)
        if target is None:
            known = ", ".join([ALL_LINEAR, *TARGET_PATHS, *HF_TARGETS])
            raise ValueError(f"--target-modules: unknown module {name!r}; known: {known}")
        if target not in targets:
            targets.append(target)
    # Megatron fuses q/k/v and gate/up: one adapter covers the whole group, so a part of a group is ambiguous.
    for target in targets:
        group = [hf for hf, t in HF_TARGETS.items() if t == target]
        given = [n for n in names if n in group]
        if given and len(given) < len(group):
            raise ValueError(
                f"--target-modules {','.join(given)}: Megatron fuses {', '.join(group)} into {target}, so an adapter "
                f"covers all of them; name all of {','.join(group)} (or {target})"
            )
    if not targets:
        raise ValueError(f"--target-modules is empty: name layers (e.g. {ALL_LINEAR} or linear_qkv,linear_proj)")
    return tuple(targets)


def add_lora_arguments(parser: argparse.ArgumentParser) -> None:
    """The LoRA group: rank (0 = off), alpha, dropout, target modules and a starting adapter."""
    g = parser.add_argument_group("LoRA (miles' flags)")
    g.add_argument("--lora-rank", type=int, default=0, help="adapter rank; 0 (default) trains the full model")
    g.add_argument("--lora-alpha", type=float, default=16.0, help="scale of the update: alpha / rank (PEFT's)")
    g.add_argument("--lora-dropout", type=float, default=0.0, help="dropout on the adapter's input (0 for RL)")
    g.add_argument(
        "--target-modules",
        default=None,
        help="layers to adapt, needed with --lora-rank: all-linear, or comma-separated Megatron names "
        "(linear_qkv,linear_proj,linear_fc1,linear_fc2) or HF names (q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,"
        "down_proj; Megatron fuses q/k/v and gate/up, so name all of a group)",
    )
    g.add_argument(
        "--lora-adapter-path", default=None, help="start from this HF PEFT adapter (adapter_config.json + safetensors)"
    )
    add_multi_lora_arguments(g)  # several adapters in one run (multi_lora_flags.py)


def validate_lora_args(args: argparse.Namespace) -> None:
    """Check the LoRA flags against each other and the layout; with LoRA on, add SGLang's LoRA server flags."""
    from slime_like.core.errors import ArgumentError

    if args.lora_rank < 0:
        raise ArgumentError(f"--lora-rank {args.lora_rank} must be >= 0 (0 turns LoRA off)")
    if not args.lora_rank:
        given = [f for f in ("target_modules", "lora_adapter_path") if getattr(args, f) is not None]
        if given:
            flags = " ".join(f"--{f.replace('_', '-')}" for f in given)
            raise ArgumentError(f"{flags} set up LoRA, which needs a positive --lora-rank (e.g. --lora-rank 16)")
        args.lora_targets = ()
        return
    if args.lora_alpha <= 0:
        raise ArgumentError(f"--lora-alpha {args.lora_alpha} must be positive")
    if not 0.0 <= args.lora_dropout < 1.0:
        raise ArgumentError(f"--lora-dropout {args.lora_dropout} must be in [0, 1)")
    if args.target_modules is None:
        raise ArgumentError("--lora-rank needs --target-modules (e.g. --target-modules all-linear)")
    path = args.lora_adapter_path
    if path is not None and not os.path.isfile(os.path.join(path, "adapter_config.json")):
        raise ArgumentError(f"--lora-adapter-path {path}: no adapter_config.json there (an HF PEFT adapter directory)")
    try:
        args.lora_targets = resolve_targets(args.target_modules)
    except ValueError as exc:
        raise ArgumentError(str(exc)) from exc
    unsupported = {
        "--pipeline-model-parallel-size > 1": args.pipeline_model_parallel_size > 1,
        "--sequence-parallel": args.sequence_parallel,
        "--context-parallel-size > 1": args.context_parallel_size > 1,
        "--fully-async": getattr(args, "fully_async", False),
        "--enable-mtp-training (the MTP layers would stay frozen)": getattr(args, "enable_mtp_training", False),
        "--use-routing-replay / --use-rollout-routing-replay (MoE experts are not adapted)": getattr(
            args, "use_routing_replay", False
        )
        or getattr(args, "use_rollout_routing_replay", False),
    }
    for flag, on in unsupported.items():
        if on:
            raise ArgumentError(f"--lora-rank does not support {flag} yet: drop one of them (docs/lora.md)")
    if args.tensor_model_parallel_size > 1 and args.lora_dropout:
        raise ArgumentError(
            f"--lora-dropout {args.lora_dropout} with --tensor-model-parallel-size {args.tensor_model_parallel_size}: "
            "use --lora-dropout 0 (TP ranks would drop different inputs of one replicated adapter)"
        )
    args.sglang_server_args = sglang_lora_flags(
        args.lora_rank,
        args.lora_targets,
        list(getattr(args, "sglang_server_args", None) or []),
        adapters=max(1, getattr(args, "multi_lora_n_adapters", 0)),  # one slot per adapter of a multi-LoRA run
    )


def sglang_lora_flags(
    rank: int, targets: tuple[str, ...], given: list[str] | None = None, adapters: int = 1
) -> list[str]:
    """SGLang server flags (after those `given`, which win) serving the base with `adapters` adapters of at most this
    rank on these layers in one batch (a run serves one policy: 1; the CPU backend is picked by
    rollout/sglang_server.py)."""
    if adapters < 1:
        raise ValueError(f"adapters={adapters}: an SGLang LoRA server needs at least one adapter slot")
    out = list(given or [])
    modules = [hf for t in targets for hf, target in HF_TARGETS.items() if target == t]
    wanted = (["--enable-lora"], ["--max-lora-rank", str(rank)], ["--lora-target-modules", *modules])
    for flag, *values in (*wanted, ["--max-loras-per-batch", str(adapters)]):
        if flag not in out:
            out += [flag, *values]
    return out
