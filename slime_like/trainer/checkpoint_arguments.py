"""Flags of checkpoints (save, load, reference) and of the weight update to the servers."""

from __future__ import annotations

import argparse
import os

from slime_like.trainer.weights.delta_arguments import add_delta_arguments, validate_delta_args


def add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """Model source, checkpoint save/load and weight-update flags."""
    g = parser.add_argument_group("checkpoint")
    g.add_argument("--hf-checkpoint", required=True, help="HF model directory (weights, config, tokenizer)")
    g.add_argument(
        "--model-name",
        default=None,
        help="slime's name of the model for Megatron -> HF weight names (e.g. qwen3, qwen3_moe, llama): checked "
        "against the HF config's model_type, which picks the conversion here",
    )
    g.add_argument(
        "--save",
        default=None,
        help="run directory for checkpoints, in Megatron-LM's layout: iter_XXXXXXX/ (the rollout id) and "
        "latest_checkpointed_iteration.txt; written atomically",
    )
    g.add_argument("--save-interval", type=int, default=None, help="save every N rollouts")
    g.add_argument(
        "--load",
        default=None,
        help="resume from a run directory (latest_checkpointed_iteration.txt; slime's too) or one iter_XXXXXXX/ or "
        "release/ directory; with no checkpoint there, start from --ref-load (or --hf-checkpoint) at rollout 0",
    )
    g.add_argument(
        "--ref-load",
        default=None,
        help="torch_dist checkpoint (run or release layout, e.g. from tools/convert_hf_to_torch_dist.py) of the KL "
        "reference model, and the starting weights when --load holds no checkpoint (default: --hf-checkpoint)",
    )
    g.add_argument("--no-load-optim", action="store_true", help="with --load: the optimizer starts fresh")
    g.add_argument(
        "--no-save-optim",
        action="store_true",
        help="checkpoints hold no optimizer or LR-scheduler state (smaller; a resume starts them fresh, as slime "
        "sets --no-load-optim with it)",
    )
    g.add_argument(
        "--save-hf",
        default=None,
        metavar="PATH",
        help="at each save also write the policy as an HF checkpoint at PATH.format(rollout_id=...) (config and "
        "tokenizer from --hf-checkpoint)",
    )
    g.add_argument(
        "--ref-ckpt-step",
        type=int,
        default=None,
        help="load the reference from --ref-load's iter_<step> instead of its latest checkpoint",
    )
    g.add_argument("--no-load-rng", action="store_true", help="with --load: keep this run's RNG states")
    g.add_argument(
        "--finetune",
        action="store_true",
        help="with --load: model weights only, from rollout 0 with the data from its start (optimizer, RNG fresh)",
    )
    g.add_argument(
        "--keep-last-n-checkpoints",
        type=int,
        default=None,
        metavar="N",
        help="after each save, delete all but the newest N iter_* checkpoints under --save (default: keep all; "
        "release/ is never deleted)",
    )
    w = parser.add_argument_group("weight update")
    w.add_argument(
        "--update-weight-transport",
        default="distributed",
        choices=["distributed", "nccl", "tensor", "disk"],
        help="distributed (slime's name: nccl): broadcast (NCCL/gloo); tensor: shared memory / CUDA IPC handles "
        "(servers on the trainer's node, e.g. --colocate); disk: safetensors files reloaded by the servers",
    )
    w.add_argument(
        "--update-weight-mode",
        default="full",
        choices=["full", "delta"],
        help="full: every update sends all weights (slime's default); delta: only the bytes that changed, published "
        "on a shared disk and applied on every rollout host (--update-weight-transport disk; docs/weight-sync.md)",
    )
    add_delta_arguments(w)
    w.add_argument("--update-weight-buffer-size", type=int, default=512 * 1024**2, help="bytes per update bucket")
    w.add_argument(
        "--update-weight-timeout", type=float, default=300.0, help="seconds any server call or broadcast may take"
    )
    w.add_argument(
        "--update-weight-retries", type=int, default=1, help="retries of a failed update before the fallback"
    )
    w.add_argument(
        "--update-weight-fallback",
        default="disk",
        choices=["disk", "none"],
        help="transport used when the chosen one failed every retry",
    )
    w.add_argument(
        "--check-weight-update",
        action="store_true",
        help="after every update, compare a probe's log-probs between the trainer and each server",
    )
    w.add_argument(
        "--check-weight-update-equal",
        action="store_true",
        help="slime's start-up check: before the first rollout, compare a probe's log-probs between the trainer "
        "and each server (slime compares the weights themselves)",
    )
    w.add_argument(
        "--update-weight-disk-keep-files",
        action="store_true",
        help="--update-weight-transport disk: keep every written weight version (default: the last two)",
    )
    w.add_argument(
        "--check-weight-update-tolerance",
        type=float,
        default=None,
        help="largest log-prob difference the check accepts (default 1e-3 in fp32, 0.1 with --bf16)",
    )


def validate_checkpoint_args(args: argparse.Namespace) -> None:
    """Reject checkpoint flags that cannot work, naming the flag; --load and --ref-load are looked at now."""
    from slime_like.trainer.megatron.checkpoint_layout import CheckpointError, find_checkpoint, require_checkpoint

    keep = args.keep_last_n_checkpoints
    if keep is not None and keep < 1:
        _error(f"--keep-last-n-checkpoints {keep} must be >= 1 (leave it out to keep every checkpoint)")
    if keep is not None and not args.save:
        _error("--keep-last-n-checkpoints needs --save DIR")
    if args.update_weight_transport == "nccl":  # slime's name of the broadcast transport
        args.update_weight_transport = "distributed"
    validate_delta_args(args)
    loading = [f for f in ("no_load_optim", "no_load_rng", "finetune") if getattr(args, f)]
    if loading and not args.load:
        _error(f"--{loading[0].replace('_', '-')} applies to what --load loads: add --load DIR (or drop it)")
    if args.no_save_optim and args.load:
        args.no_load_optim = True  # as slime: a run that saves no optimizer does not load one either
    if args.save_hf is not None and not (args.save and args.save_interval):
        _error("--save-hf writes an HF checkpoint at each save: it needs --save DIR and --save-interval N")
    if args.save_hf is not None and getattr(args, "lora_rank", 0):
        _error("--save-hf exports full weights; a LoRA run (--lora-rank) saves its adapter with each checkpoint")
    if args.ref_ckpt_step is not None and not args.ref_load:
        _error("--ref-ckpt-step picks a checkpoint of --ref-load: add --ref-load DIR")
    if args.update_weight_disk_keep_files and "disk" not in (args.update_weight_transport, args.update_weight_fallback):
        _error(
            "--update-weight-disk-keep-files keeps the disk transport's files: it needs --update-weight-transport disk"
        )
    try:
        if args.ref_load:
            require_checkpoint(args.ref_load, "--ref-load", args.ref_ckpt_step)
        if args.load and os.path.isdir(args.load):
            find_checkpoint(args.load, "--load")  # a cut-off checkpoint or a bad tracker fails now
    except (CheckpointError, OSError) as exc:
        _error(str(exc))


def _error(message: str) -> None:
    from slime_like.core.errors import ArgumentError

    raise ArgumentError(message)
