"""Command-line arguments: each module adds its own group; parsed before any heavy import."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from buffer.arguments import add_data_arguments
from rollout.arguments import (
    add_rollout_arguments,
    requested_server_dtype,
    server_dtype,
    sglang_passthrough,
    validate_rollout_args,
)
from rollout.debug_data import add_debug_arguments, validate_debug_args
from rollout.slime_arguments import add_slime_rollout_arguments, validate_slime_rollout_args
from slime_like.core.errors import ArgumentError
from slime_like.core.logs import LEVELS
from slime_like.planner import (
    MEMORY_WARNING,
    add_plan_arguments,
    count_problems,
    dry_run,
    load_hf_config,
    make_plan,
)
from slime_like.trainer.algorithm_arguments import (
    add_algorithm_arguments,
    apply_routing_replay,
    validate_algorithm_args,
)
from slime_like.trainer.checkpoint_arguments import add_checkpoint_arguments
from slime_like.trainer.megatron.flags import add_training_arguments, mtp_config_problems, validate_training_args
from slime_like.trainer.megatron.lora_flags import add_lora_arguments, validate_lora_args
from slime_like.trainer.megatron.multi_lora_flags import validate_multi_lora_args
from slime_like.trainer.model_arguments import add_model_arguments, check_against_hf_config, text_config
from slime_like.trainer.train_options import add_train_option_arguments, validate_train_options
from slime_like.trainer.training_arguments import add_megatron_arguments, validate_megatron_args


def build_parser() -> argparse.ArgumentParser:
    """The full parser of a training run."""
    parser = argparse.ArgumentParser(
        description="slime-like: RL post-training with Megatron (training) and SGLang (rollout)",
        allow_abbrev=False,
    )
    add_checkpoint_arguments(parser)
    add_data_arguments(parser)
    add_rollout_arguments(parser)
    add_slime_rollout_arguments(parser)
    add_megatron_arguments(parser)
    add_training_arguments(parser)
    add_lora_arguments(parser)
    add_offload_arguments(parser)
    add_algorithm_arguments(parser)
    add_train_option_arguments(parser)
    add_loop_arguments(parser)
    add_model_arguments(parser)
    add_plan_arguments(parser)
    add_debug_arguments(parser)
    g = parser.add_argument_group("logging")
    g.add_argument("--output-dir", default="outputs/run", help="metrics.jsonl, plots and logs go here")
    g.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=LEVELS,
        help="console of the driver, the rollout manager and trainer rank 0, and every process's file in "
        "output-dir/logs/ (other trainer ranks show only warnings and errors on the console)",
    )
    g.add_argument("--use-tensorboard", action="store_true")
    g.add_argument(
        "--tb-project-name",
        default=None,
        help="tensorboard logs go to tensorboard_log/<project>/<experiment> as slime's ($TENSORBOARD_DIR wins; "
        "default: output-dir/tensorboard)",
    )
    g.add_argument("--tb-experiment-name", default=None, help="with --tb-project-name (default: the start time)")
    g.add_argument("--use-wandb", action="store_true")
    g.add_argument("--wandb-project", default="slime-like")
    g.add_argument("--wandb-group", default=None, help="wandb run group (the run is named after it, as slime)")
    g.add_argument("--wandb-team", default=None, help="wandb entity")
    g.add_argument("--wandb-host", default=None, help="wandb server URL (self-hosted)")
    g.add_argument("--wandb-key", default=None, help="wandb API key (default: WANDB_API_KEY / wandb login)")
    g.add_argument("--wandb-dir", default=None, help="directory of wandb's local files (default: ./wandb)")
    g.add_argument(
        "--wandb-mode",
        default=None,
        choices=["online", "offline", "disabled"],
        help="wandb's mode (sets WANDB_MODE; offline: local only, no login)",
    )
    g.add_argument("--wandb-run-id", default=None, help="log into this wandb run (resumed if it exists)")
    g.add_argument(
        "--wandb-always-use-train-step",
        action="store_true",
        help="wandb's step is the optimizer step count (rollout x steps per rollout), not the rollout id",
    )
    g.add_argument(
        "--disable-wandb-random-suffix",
        action="store_false",
        dest="wandb_random_suffix",
        help="name the run exactly --wandb-group (default: a random 6-character suffix is added)",
    )
    g.add_argument(
        "--train-backend", default="megatron", choices=["megatron"], help="slime's flag: megatron is the one backend"
    )
    g.add_argument("--ray-num-cpus", type=int, default=8, help="logical CPUs of a local Ray instance")
    g.add_argument(
        "--device",
        choices=["auto", "cuda", "cpu"],
        default="auto",
        help="where trainer ranks and engines run: auto = GPUs when the Ray cluster has any, else CPUs "
        "(decided from the cluster, not from the machine the driver runs on)",
    )
    return parser


def add_offload_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the trainer's GPU memory goes between phases of a colocated run."""
    g = parser.add_argument_group("colocated GPU memory")
    g.add_argument(
        "--offload-train",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with --colocate on GPU: the trainer's weights, gradient buffers and optimizer states leave the GPU "
        "while the servers generate and come back before log-probs and training (needs torch_memory_saver). "
        "Default: on with --colocate when CUDA is present, else off. Without CUDA it is accepted and does "
        "nothing (one log line says so)",
    )
    g.add_argument("--offload", action="store_true", help="slime's shorthand: --offload-train --offload-rollout")
    g.add_argument(
        "--offload-rollout",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with --colocate on GPU: the SGLang servers release their memory while the trainer trains "
        "(default: on with --colocate, as slime); --no-offload-rollout keeps it",
    )


def add_loop_arguments(parser: argparse.ArgumentParser) -> None:
    """slime's flags of the training loop: where it starts, the first evaluation, how often weights move."""
    g = parser.add_argument_group("loop (slime's flags)")
    g.add_argument(
        "--start-rollout-id",
        type=int,
        default=None,
        help="the first rollout id of the loop (default: the one after --load's checkpoint, else 0)",
    )
    g.add_argument(
        "--skip-eval-before-train", action="store_true", help="no evaluation at rollout 0 (with --eval-interval)"
    )
    g.add_argument(
        "--update-weights-interval",
        type=int,
        default=1,
        metavar="N",
        help="push the trained weights to the servers after every N-th rollout (default: every rollout)",
    )


def resolve_offload_train(args: argparse.Namespace, cuda: bool | None = None) -> None:
    """Fill --offload-train's default and check it can work here (torch_memory_saver on CUDA machines)."""
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    if args.offload_train is None:
        args.offload_train = bool(args.colocate and cuda)
    if args.offload_train and not args.colocate:
        raise ArgumentError(
            "--offload-train frees the trainer's GPU memory for colocated servers: it needs --colocate "
            "(or drop --offload-train)"
        )
    if args.offload_train and cuda:
        from slime_like.trainer.megatron.offload import memory_saver_problem

        problem = memory_saver_problem()
        if problem:
            raise ArgumentError(problem)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and validate; unknown flags other than `--sglang-*` are an error, never ignored.

    Every start runs the planner's checks before anything is launched: a layout that cannot be placed fails
    here, naming the flags and the numbers; a memory estimate over the assumed --gpu-memory-gb only warns (on
    stderr, and kept in `args.plan_warnings` for the run's log), since on CPU runs or GPUs of another size it
    does not apply. --dry-run prints the plan and exits: 1 if it has layout or memory problems, 0 if not.
    """
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    args.sglang_server_args, rest = sglang_passthrough(unknown)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    counts = count_problems(args)  # before anything divides by them
    if counts:
        parser.error("\n  ".join(counts))
    try:
        validate(args)
        config = load_hf_config(args.hf_checkpoint)
        problems = check_against_hf_config(args, config) + mtp_config_problems(args, text_config(config))
        apply_routing_replay(args, text_config(config))
    except (ArgumentError, ValueError, OSError) as exc:
        parser.error(str(exc))
    if problems:
        parser.error("the model flags contradict the HF config of --hf-checkpoint:\n  " + "\n  ".join(problems))
    plan = make_plan(args, config)  # the planner reads the language model's part (core.hf_config.hf_field)
    family = family_problem(args.hf_checkpoint, config, bool(getattr(args, "multimodal_keys", None)))
    if family:
        parser.error(family)
    for line in args.start_warnings:
        print(f"warning: {line}", file=sys.stderr)
    if args.dry_run:
        parser.exit(dry_run(plan))
    if plan.problems:
        parser.error("this layout cannot be placed (--dry-run prints the plan):\n  " + "\n  ".join(plan.problems))
    args.plan_warnings = [MEMORY_WARNING.format(problem=p, gb=args.gpu_memory_gb) for p in plan.memory]
    for warning in args.plan_warnings:
        print(warning, file=sys.stderr)
    return args


def family_problem(hf_checkpoint: str, config: Any, images: bool = False) -> str | None:
    """Why the trainer cannot build this checkpoint's model (no registered model family; with `images`
    (--multimodal-keys), no vision tower built for it), or None if it can."""
    from slime_like.trainer.megatron.families import family_of, vision_problem  # the table only: no Megatron

    if images and (problem := vision_problem(config)):
        return f"--multimodal-keys with --hf-checkpoint {hf_checkpoint}: {problem}"

    try:
        family_of(config)
    except ValueError as exc:
        architecture = (getattr(config, "architectures", None) or [config.model_type])[0]
        return (
            f"--hf-checkpoint {hf_checkpoint} is a {architecture} (model_type {config.model_type!r}), which this "
            f"engine cannot train yet: no model family is registered for it, so its Megatron model and its "
            f"HF <-> Megatron weight names are missing (slime_like/trainer/megatron/families.py; {exc})"
        )
    return None


def validate(args: argparse.Namespace) -> None:
    """Fill derived defaults and reject contradictions, naming the flags involved; notes for the start-up log go
    to `args.start_warnings`."""
    args.start_warnings = []
    validate_training_args(args)  # --num-steps-per-rollout sets --global-batch-size
    samples = args.rollout_batch_size * args.n_samples_per_prompt
    if args.global_batch_size is None:
        args.global_batch_size = samples
    if samples % args.global_batch_size:
        raise ArgumentError(
            f"--rollout-batch-size x --n-samples-per-prompt = {samples} samples per rollout must be a multiple "
            f"of --global-batch-size {args.global_batch_size}"
        )
    args.world_size = args.actor_num_nodes * args.actor_num_gpus_per_node
    model_parallel = args.tensor_model_parallel_size * args.pipeline_model_parallel_size * args.context_parallel_size
    if args.world_size % model_parallel:
        raise ArgumentError(
            f"trainer ranks (--actor-num-nodes x --actor-num-gpus-per-node = {args.world_size}) must be a multiple of "
            f"TP x PP x CP = {model_parallel} (--tensor-model-parallel-size {args.tensor_model_parallel_size} x "
            f"--pipeline-model-parallel-size {args.pipeline_model_parallel_size} x --context-parallel-size "
            f"{args.context_parallel_size})"
        )
    args.data_parallel_size = args.world_size // model_parallel
    if args.rollout_num_gpus is None:
        # slime: colocated, the engines take the trainer's GPUs unless told otherwise; apart, 1 (slime has no default)
        args.rollout_num_gpus = args.world_size if args.colocate else 1
    if args.global_batch_size % args.data_parallel_size:
        raise ArgumentError(
            f"--global-batch-size {args.global_batch_size} must divide over {args.data_parallel_size} DP ranks"
        )
    if args.save_interval and not args.save:
        raise ArgumentError("--save-interval needs --save DIR")
    if not os.path.isfile(os.path.join(args.hf_checkpoint, "config.json")):
        raise ArgumentError(f"--hf-checkpoint {args.hf_checkpoint}: no config.json there")
    if args.offload:  # slime: both sides give their memory up in turn
        args.offload_train = True if args.offload_train is None else args.offload_train
        args.offload_rollout = True if args.offload_rollout is None else args.offload_rollout
    resolve_offload_train(args)
    if args.offload_rollout is None:
        args.offload_rollout = bool(args.colocate)
    if args.offload_rollout and not args.colocate:
        raise ArgumentError(
            "--offload-rollout frees the servers' GPU memory for a colocated trainer: it needs --colocate "
            "(or drop --offload-rollout)"
        )
    validate_megatron_args(args)
    validate_algorithm_args(args)
    validate_multi_lora_args(args)  # before the rollout flags: its data source stands in for --prompt-data
    validate_rollout_args(args)  # loads the plugins too: a bad path fails before anything starts
    validate_lora_args(args)  # after --fully-async is settled; adds SGLang's LoRA server flags
    validate_debug_args(args)
    validate_slime_rollout_args(args)
    validate_train_options(args)
    if args.update_weights_interval < 1:
        raise ArgumentError(f"--update-weights-interval {args.update_weights_interval} must be >= 1")
    if args.start_rollout_id is not None and args.start_rollout_id < 0:
        raise ArgumentError(f"--start-rollout-id {args.start_rollout_id} must be >= 0")


def resolve_precision(args: argparse.Namespace, use_gpu: bool) -> str:
    """Settle --bf16 once the devices are known (bfloat16 on GPU, float32 on CPU, unless given) and check that
    the servers run at the trainer's precision; returns the start-up line that says which and why."""
    why = "--bf16" if args.bf16 else "--no-bf16"
    if args.bf16 is None:
        args.bf16 = use_gpu
        why = "the GPU default, as slime" if use_gpu else "the CPU default; --bf16 for bfloat16"
    trainer = server_dtype(args)
    asked = requested_server_dtype(args)
    if asked is not None and asked != trainer:
        raise ArgumentError(
            f"--sglang-dtype {asked}: the servers would generate at another precision than the trainer "
            f"({trainer}, {why}), and rollout log-probs would not match training's; drop --sglang-dtype (the "
            f"servers follow the trainer) or set --bf16/--no-bf16 to match it"
        )
    return f"precision: training and rollout in {trainer} ({why})"
