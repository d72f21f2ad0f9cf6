"""Flags of the trainer: Megatron parallelism and optimizer (Megatron's own names), placement, --custom-config-path.

The algorithm's flags are in algorithm_arguments.py, the checkpoints' and weight update's in checkpoint_arguments.py."""

from __future__ import annotations

import argparse

from slime_like.trainer.checkpoint_arguments import validate_checkpoint_args


def add_megatron_arguments(parser: argparse.ArgumentParser) -> None:
    """Megatron's flags, under Megatron-LM's names so launch scripts move over unchanged."""
    g = parser.add_argument_group("megatron")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1)
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    g.add_argument("--expert-model-parallel-size", type=int, default=1)
    g.add_argument("--expert-tensor-parallel-size", type=int, default=None, help="default: the TP size")
    g.add_argument("--decoder-first-pipeline-num-layers", type=int, default=None, help="layers of the first PP stage")
    g.add_argument("--decoder-last-pipeline-num-layers", type=int, default=None, help="layers of the last PP stage")
    g.add_argument(
        "--context-parallel-size",
        type=int,
        default=1,
        help="split every sequence over this many ranks (zig-zag; needs CUDA with Transformer Engine)",
    )
    g.add_argument(
        "--sequence-parallel",
        action="store_true",
        help="split activations outside attention/MLP over the TP ranks (needs TP > 1 and Transformer Engine)",
    )
    g.add_argument(
        "--use-distributed-optimizer",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="shard the optimizer states over the DP ranks (ZeRO-1); on by default, as slime forces it",
    )
    g.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="train in bfloat16 (default: on GPU, as slime; fp32 on CPU); the SGLang servers always run at the "
        "trainer's precision",
    )
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--lr", type=float, default=1e-6)
    g.add_argument("--min-lr", type=float, default=0.0)
    g.add_argument("--lr-warmup-iters", type=int, default=0)
    g.add_argument("--lr-decay-style", default="constant", choices=["constant", "linear", "cosine"])
    g.add_argument("--weight-decay", type=float, default=0.0)
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.98)
    g.add_argument("--adam-eps", type=float, default=1e-8)
    g.add_argument("--clip-grad", type=float, default=1.0)
    g.add_argument(
        "--global-batch-size", type=int, default=None, help="samples per optimizer step (default: all of a rollout)"
    )
    g.add_argument("--max-tokens-per-gpu", type=int, default=4096, help="token budget of one packed micro-batch")
    t = parser.add_argument_group("training placement")
    t.add_argument("--actor-num-nodes", type=int, default=1)
    t.add_argument("--actor-num-gpus-per-node", type=int, default=1, help="trainer ranks per node (processes on CPU)")
    t.add_argument("--colocate", action="store_true", help="training and rollout share the same devices")
    t.add_argument(
        "--num-rollout",
        type=int,
        default=None,
        help="rollout/train iterations to run (or --num-epoch; given both, --num-epoch is ignored, as slime)",
    )


SEQUENCE_PARALLEL_OFF = (
    "--sequence-parallel is off: --tensor-model-parallel-size is 1, so there are no tensor-parallel ranks to split "
    "activations over (Megatron-LM turns it off the same way)"
)


def validate_megatron_args(args: argparse.Namespace) -> None:
    """Reject Megatron parallel settings that cannot run, naming the flags (the device checks come at start)."""
    if args.context_parallel_size < 1:
        _error(f"--context-parallel-size {args.context_parallel_size} must be >= 1")
    if args.sequence_parallel and args.tensor_model_parallel_size == 1:
        # As Megatron-LM's validate_args: with nothing to split over, sequence parallel is off, with a warning.
        args.sequence_parallel = False
        if hasattr(args, "start_warnings"):
            args.start_warnings.append(SEQUENCE_PARALLEL_OFF)
    validate_checkpoint_args(args)


def _error(message: str) -> None:
    from slime_like.core.errors import ArgumentError

    raise ArgumentError(message)


def apply_custom_config(args: argparse.Namespace) -> list[str]:
    """--custom-config-path: set each key of the YAML mapping on args, as slime does; returns the keys set.

    A key that names a flag overrides the command line (before the checks, so they see it); any other key is
    new, for plugins to read (slime's custom functions take their settings this way).
    """
    path = getattr(args, "custom_config_path", None)
    if not path:
        return []
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as exc:
        _error(f"--custom-config-path {path}: cannot read it as YAML ({exc})")
    if not isinstance(data, dict) or not all(isinstance(k, str) and k.isidentifier() for k in data):
        _error(f"--custom-config-path {path}: expected a mapping of argument names (like use_tis: true) to values")
    for key, value in data.items():
        setattr(args, key, value)
    return list(data)
