"""Megatron-LM training flags of slime's launch scripts, beyond the parallel sizes and the architecture.

Each flag keeps Megatron's name and meaning. What the engine can honour is mapped here to what it builds:
`optimizer_settings` (megatron-core's OptimizerConfig through OptimizerSettings) and `model_config_overrides`
(TransformerConfig fields through the bridge). Kernel, fusion and overlap switches pick GPU code paths: they
are honoured with Transformer Engine on GPU where megatron-core has the field, and otherwise accepted and
named in one start-up line (`no_effect_line`), never silently. Importing this module is cheap (no torch).
"""

from __future__ import annotations

import argparse
from typing import Any

from slime_like.core.hf_config import hf_field

ATTENTION_BACKENDS = ("flash", "fused", "unfused", "local", "auto")

# Flags accepted without effect on every machine: (flag, argparse kwargs, why).
ALWAYS_NO_EFFECT: tuple[tuple[str, dict[str, Any], str], ...] = (
    ("--use-flash-attn", {"action": "store_true"}, "legacy switch; Transformer Engine picks the kernel"),
    ("--overlap-grad-reduce", {"action": "store_true"}, "the engine reduces gradients once per step"),
    ("--overlap-param-gather", {"action": "store_true"}, "the engine gathers parameters once per step"),
    ("--moe-enable-deepep", {"action": "store_true"}, "the engine keeps Megatron's default token dispatcher"),
    ("--no-check-for-nan-in-loss-and-grad", {"action": "store_true"}, "the engine does not run the NaN check"),
    ("--data-pad-size-multiplier", {"type": int, "default": None}, "padding follows TP/CP (packing.pad_multiple)"),
    ("--log-probs-chunk-size", {"type": int, "default": -1}, "log-probs take one pass; results are the same"),
    ("--allgather-cp", {"action": "store_true"}, "only for DSA models, which the engine does not build"),
    ("--make-vocab-size-divisible-by", {"type": int, "default": None}, "the HF vocabulary is used unpadded"),
    ("--seq-length", {"type": int, "default": None}, "sequences are packed by --max-tokens-per-gpu"),
    ("--enable-experimental", {"action": "store_true"}, "no experimental Megatron feature is used"),
    ("--micro-batch-size", {"type": int, "default": 1}, "micro-batches are packed by --max-tokens-per-gpu"),
    ("--async-save", {"action": "store_true"}, "checkpoints are written synchronously and atomically"),
    (
        "--qwen-gdn-backend",
        {"choices": ["fla", "flashqla"], "default": None},
        "kernel of slime's Qwen3-Next/3.5 layer; here those are megatron-core's own GatedDeltaNet",
    ),
    ("--recompute-loss-function", {"action": "store_true"}, "the loss is computed from the logits in one pass"),
    ("--log-probs-max-tokens-per-gpu", {"type": int, "default": None}, "slime reads it nowhere either"),
    (
        "--balance-by-flops",
        {"action": "store_true"},
        "micro-batches are packed by tokens and split over DP ranks by tokens; slime's FLOPs-balanced schedule "
        "only moves samples between micro-batches and ranks (speed, not the result)",
    ),
)

# Model families whose multi-token-prediction layers --enable-mtp-training builds and trains (slime_like/trainer/megatron/mtp.py):
# MiMo's, and the DeepSeek layout's (model.layers.{num_hidden_layers + i}).
MTP_TRAINED_FAMILIES = ("mimo", "deepseek_v3", "kimi_k2", "glm4_moe_lite", "glm4_moe")

# Megatron TransformerConfig switches honoured with Transformer Engine on GPU (the local spec has them off):
# (flag, TransformerConfig field, value the flag sets).
TE_SWITCHES: tuple[tuple[str, str, Any], ...] = (
    ("--no-gradient-accumulation-fusion", "gradient_accumulation_fusion", False),
    ("--no-masked-softmax-fusion", "masked_softmax_fusion", False),
    ("--no-rope-fusion", "apply_rope_fusion", False),
)

# Uneven pipeline stages: (flag dest, TransformerConfig field).
PIPELINE_SPLIT = (
    ("decoder_first_pipeline_num_layers", "num_layers_in_first_pipeline_stage"),
    ("decoder_last_pipeline_num_layers", "num_layers_in_last_pipeline_stage"),
)

RECOMPUTE = ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules")

# OptimizerConfig fields only meaningful with the optimizer's states on a GPU.
GPU_OPTIMIZER_FLAGS = ("optimizer_cpu_offload", "overlap_cpu_optimizer_d2h_h2d", "use_precision_aware_optimizer")


def add_training_arguments(parser: argparse.ArgumentParser) -> None:
    """Optimizer, recompute, dropout, precision, batching and kernel flags under Megatron-LM's names."""
    g = parser.add_argument_group("megatron optimizer")
    g.add_argument("--optimizer", default="adam", choices=["adam", "sgd"], help="adam is AdamW (decoupled decay)")
    g.add_argument("--sgd-momentum", type=float, default=0.9, help="with --optimizer sgd")
    g.add_argument(
        "--lr-warmup-fraction", type=float, default=None, help="warmup steps as a fraction of all optimizer steps"
    )
    g.add_argument("--optimizer-cpu-offload", action="store_true", help="GPU: optimizer states and step on the CPU")
    g.add_argument("--optimizer-offload-fraction", type=float, default=1.0, help="with --optimizer-cpu-offload")
    g.add_argument("--overlap-cpu-optimizer-d2h-h2d", action="store_true", help="GPU: with --optimizer-cpu-offload")
    g.add_argument(
        "--use-precision-aware-optimizer", action="store_true", help="GPU with Transformer Engine: its FusedAdam"
    )
    g.add_argument(
        "--accumulate-allreduce-grads-in-fp32",
        action="store_true",
        help="fp32 gradient buffers and reduction: always the case here (as slime's bf16 runs)",
    )
    r = parser.add_argument_group("megatron recompute, dropout and kernels")
    r.add_argument("--recompute-granularity", default=None, choices=["full", "selective"])
    r.add_argument("--recompute-method", default=None, choices=["uniform", "block"])
    r.add_argument("--recompute-num-layers", type=int, default=None)
    r.add_argument("--recompute-modules", nargs="*", default=None, help="with --recompute-granularity selective")
    r.add_argument("--hidden-dropout", type=float, default=None, help="default: the HF config's (0 for most)")
    r.add_argument("--attention-dropout", type=float, default=None, help="default: the HF config's attention_dropout")
    r.add_argument("--attention-backend", default=None, choices=ATTENTION_BACKENDS, help="GPU with Transformer Engine")
    r.add_argument("--deterministic-mode", action="store_true", help="GPU: deterministic kernels")
    for flag, _, _ in TE_SWITCHES:
        r.add_argument(flag, action="store_true", help="GPU with Transformer Engine (off on the CPU path)")
    for flag, kwargs, why in ALWAYS_NO_EFFECT:
        r.add_argument(flag, help=f"accepted without effect: {why}", **kwargs)
    m = parser.add_argument_group("multi-token prediction (slime)")
    m.add_argument(
        "--enable-mtp-training",
        action="store_true",
        help=f"build, train and export the checkpoint's MTP layers ({', '.join(MTP_TRAINED_FAMILIES)}); without it "
        "they are passed through unchanged",
    )
    m.add_argument("--mtp-num-layers", type=int, default=None, help="the checkpoint's num_nextn_predict_layers")
    m.add_argument(
        "--mtp-loss-scaling-factor",
        type=float,
        default=0.2,
        help="the MTP loss enters the step's loss x this / --mtp-num-layers",
    )
    b = parser.add_argument_group("micro-batching (slime)")
    b.add_argument(
        "--use-dynamic-batch-size",
        action="store_true",
        help="micro-batches packed up to --max-tokens-per-gpu tokens: what the engine always does",
    )
    b.add_argument(
        "--balance-data",
        action="store_true",
        help="balance the work over DP ranks: each step of a rollout is always split by tokens over DP ranks",
    )
    b.add_argument(
        "--num-steps-per-rollout",
        type=int,
        default=None,
        help="optimizer steps per rollout: sets --global-batch-size to rollout-batch-size x n-samples-per-prompt / k",
    )
    from slime_like.trainer.megatron.local_kernels_flags import add_local_kernel_arguments

    add_local_kernel_arguments(parser)  # --local-core-attention, --local-fused-elementwise, --local-grouped-experts


def validate_training_args(args: argparse.Namespace) -> None:
    """Apply --custom-config-path, fill --global-batch-size from --num-steps-per-rollout and reject
    contradictions, naming the flags."""
    from slime_like.core.errors import ArgumentError
    from slime_like.trainer.training_arguments import apply_custom_config

    apply_custom_config(args)  # first, so every check below sees the values it sets
    if args.enable_mtp_training:
        _check_mtp_layout(args)
    k = args.num_steps_per_rollout
    if k is not None:
        samples = args.rollout_batch_size * args.n_samples_per_prompt
        if k < 1 or samples % k:
            raise ArgumentError(
                f"--num-steps-per-rollout {k} must divide the {samples} samples of a rollout "
                "(--rollout-batch-size x --n-samples-per-prompt)"
            )
        if args.global_batch_size is not None and args.global_batch_size != samples // k:
            raise ArgumentError(
                f"--num-steps-per-rollout {k} means --global-batch-size {samples // k}, not {args.global_batch_size}: "
                "drop one of them"
            )
        args.global_batch_size = samples // k
    if args.lr_warmup_fraction is not None:
        if args.lr_warmup_iters:
            raise ArgumentError("--lr-warmup-fraction and --lr-warmup-iters both set the warmup: drop one")
        if not 0.0 <= args.lr_warmup_fraction <= 1.0:
            raise ArgumentError(f"--lr-warmup-fraction {args.lr_warmup_fraction} must be between 0 and 1")
    if args.recompute_granularity == "full" and (args.recompute_method is None or args.recompute_num_layers is None):
        raise ArgumentError("--recompute-granularity full needs --recompute-method and --recompute-num-layers")
    if args.recompute_granularity != "full" and (args.recompute_method or args.recompute_num_layers is not None):
        raise ArgumentError("--recompute-method and --recompute-num-layers need --recompute-granularity full")
    if args.recompute_modules and args.recompute_granularity != "selective":
        raise ArgumentError("--recompute-modules needs --recompute-granularity selective")
    for flag in ("hidden_dropout", "attention_dropout"):
        value = getattr(args, flag)
        if value is not None and not 0.0 <= value < 1.0:
            raise ArgumentError(f"--{flag.replace('_', '-')} {value} must be in [0, 1)")


def _check_mtp_layout(args: argparse.Namespace) -> None:
    """--enable-mtp-training's needs that the command line alone decides (as slime: --mtp-num-layers is required);
    any PP and CP size trains them (the MTP block on the last pipeline stage, its loss over the CP split: mtp.py)."""
    from slime_like.core.errors import ArgumentError

    if not args.mtp_num_layers or args.mtp_num_layers < 1:
        raise ArgumentError(
            "--enable-mtp-training needs --mtp-num-layers N: the number of MTP layers of the checkpoint "
            "(its config's num_nextn_predict_layers)"
        )


def mtp_engine_args(args: argparse.Namespace) -> dict[str, Any]:
    """The policy engine's MTP arguments (MegatronTrainEngine): none without --enable-mtp-training."""
    if not getattr(args, "enable_mtp_training", False):
        return {}
    return {"mtp_layers": args.mtp_num_layers, "mtp_loss_scaling_factor": args.mtp_loss_scaling_factor}


def mtp_config_problems(args: argparse.Namespace, hf_config: Any) -> list[str]:
    """What in the HF config contradicts --enable-mtp-training (model family, MTP layers the checkpoint has);
    --mtp-num-layers against the config's count is model_arguments' check."""
    if not args.enable_mtp_training:
        return []
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in MTP_TRAINED_FAMILIES:
        return [
            f"--enable-mtp-training: MTP layers are trained for {', '.join(MTP_TRAINED_FAMILIES)} only, not "
            f"model_type {model_type!r} (without the flag its MTP layers are passed through unchanged)"
        ]
    if not hf_field(hf_config, "mtp_num_layers"):
        return ["--enable-mtp-training: the checkpoint has no MTP layers (num_nextn_predict_layers is 0 or absent)"]
    return []


def optimizer_settings(
    args: argparse.Namespace, lr: float, steps_per_rollout: int, cuda: bool, transformer_engine: bool = False
) -> Any:
    """The OptimizerSettings a trainer rank builds from the flags (GPU-only optimizer flags only on CUDA)."""
    from slime_like.trainer.megatron.optimizer import OptimizerSettings

    total_steps = args.num_rollout * steps_per_rollout
    warmup = args.lr_warmup_iters
    if args.lr_warmup_fraction is not None:
        warmup = int(args.lr_warmup_fraction * total_steps)
    gpu_only = {flag: bool(getattr(args, flag)) and cuda for flag in GPU_OPTIMIZER_FLAGS}
    # Megatron's precision-aware optimizer is TE's FusedAdam inside the distributed optimizer.
    gpu_only["use_precision_aware_optimizer"] &= args.use_distributed_optimizer and transformer_engine
    return OptimizerSettings(
        lr=lr,
        min_lr=args.min_lr,
        weight_decay=args.weight_decay,
        clip_grad=args.clip_grad,
        adam_beta1=args.adam_beta1,
        adam_beta2=args.adam_beta2,
        adam_eps=args.adam_eps,
        use_distributed_optimizer=args.use_distributed_optimizer,
        lr_warmup_steps=warmup,
        lr_decay_steps=total_steps if args.lr_decay_style != "constant" else None,
        lr_decay_style=args.lr_decay_style,
        optimizer=args.optimizer,
        sgd_momentum=args.sgd_momentum,
        optimizer_offload_fraction=args.optimizer_offload_fraction,
        stateless_adam=bool(getattr(args, "use_stateless_adam", False)),
        **gpu_only,
    )


def model_config_overrides(args: argparse.Namespace, transformer_engine: bool, cuda: bool) -> dict[str, Any]:
    """TransformerConfig fields the flags set, for make_bridge (uneven pipeline stages; kernel switches only with
    Transformer Engine; recompute only on CUDA: Megatron's activation checkpointing saves and restores CUDA RNG
    states)."""
    out: dict[str, Any] = {}
    for flag, field in PIPELINE_SPLIT:
        if getattr(args, flag, None) is not None and args.pipeline_model_parallel_size > 1:
            out[field] = getattr(args, flag)
    for field in (*(RECOMPUTE if cuda else ()), "hidden_dropout", "attention_dropout"):
        if getattr(args, field) is not None:
            out[field] = getattr(args, field)
    if getattr(args, "attention_softmax_in_fp32", False):
        out["attention_softmax_in_fp32"] = True
    if getattr(args, "local_core_attention", "auto") != "auto":  # make_bridge's choice (torch_attention.py)
        out["torch_attention"] = args.local_core_attention
    if transformer_engine:
        if args.attention_backend is not None:
            out["attention_backend"] = args.attention_backend
        if args.deterministic_mode:
            out["deterministic_mode"] = True
        for flag, field, value in TE_SWITCHES:
            if getattr(args, _dest(flag)):
                out[field] = value
    return out


def no_effect_flags(args: argparse.Namespace, transformer_engine: bool, cuda: bool) -> list[str]:
    """The flags given on this command line that change nothing on this machine."""
    from rollout.slime_arguments import ROLLOUT_NO_EFFECT

    found = [
        flag
        for flag, kw, _ in ALWAYS_NO_EFFECT + ROLLOUT_NO_EFFECT
        if getattr(args, _dest(flag), kw.get("default", False)) != kw.get("default", False)
    ]
    if not args.enable_mtp_training:  # the MTP layers are then passed through, not built
        found += ["--mtp-num-layers"] if args.mtp_num_layers is not None else []
        found += ["--mtp-loss-scaling-factor"] if args.mtp_loss_scaling_factor != 0.2 else []
    if not transformer_engine:
        found += ["--attention-backend"] if args.attention_backend is not None else []
        found += ["--deterministic-mode"] if args.deterministic_mode else []
        found += [flag for flag, _, _ in TE_SWITCHES if getattr(args, _dest(flag))]
    if not cuda:
        found += [f"--{f.replace('_', '-')}" for f in GPU_OPTIMIZER_FLAGS[:2] if getattr(args, f)]
        found += [f"--{f.replace('_', '-')}" for f in RECOMPUTE if getattr(args, f) is not None]
    if args.use_precision_aware_optimizer and not (transformer_engine and args.use_distributed_optimizer):
        found.append("--use-precision-aware-optimizer")
    from slime_like.trainer.megatron.local_kernels_flags import no_effect_local_kernel_flags

    found += no_effect_local_kernel_flags(args, transformer_engine)
    # Architecture switches of model_arguments.py that pick kernels, not shapes.
    found += [f for f in ("--moe-grouped-gemm", "--moe-permute-fusion") if getattr(args, _dest(f), False)]
    return found


def no_effect_line(args: argparse.Namespace, transformer_engine: bool, cuda: bool) -> str | None:
    """The start-up line naming the flags accepted without effect here (None when there are none)."""
    flags = no_effect_flags(args, transformer_engine, cuda)
    return f"accepted without effect here: {' '.join(flags)}" if flags else None


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")
