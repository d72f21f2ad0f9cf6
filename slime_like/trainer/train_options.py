"""slime's trainer flags beyond the core ones: which parameters train, optimizer-state resets, the reference's
refresh, the trainer processes' environment and process group; and slime's trainer flags that cannot work here,
each refused at start naming why."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from typing import Any

from slime_like.core.refused import add_refused

DEEPGEMM = "slime's SGLang-compatible block-FP8 DeepGEMM forward kernels are not part of this engine"
MEMORY = (
    "slime's GPU memory recorder (torch/memray snapshots of the trainer) is not part of this engine; "
    "--offload-train logs the trainer's memory accounting in the step metrics"
)
CI = "slime's own CI assertions (grad-norm record/compare, KL and log-prob checks) belong to slime's test harness"
REFUSED: tuple[tuple[str, str], ...] = (
    ("--megatron-deepgemm-forward-layers", DEEPGEMM),
    ("--megatron-deepgemm-forward-modules", DEEPGEMM),
    ("--megatron-deepgemm-moe-forward-layers", DEEPGEMM),
    ("--megatron-deepgemm-moe-forward-modules", DEEPGEMM),
    ("--memory-recorder", MEMORY),
    ("--memory-snapshot-dir", MEMORY),
    ("--memory-snapshot-num-steps", MEMORY),
    ("--record-memory-history", MEMORY),
    ("--profile-target", "there is no PyTorch profiler integration (slime's --use-pytorch-profiler targets)"),
    ("--ci-test", CI),
    ("--ci-disable-kl-checker", CI),
    ("--ci-save-grad-norm", CI),
    ("--ci-load-grad-norm", CI),
    ("--ci-train-rollout-logprob-abs-diff-threshold", CI),
)


def json_env(text: str) -> dict[str, str]:
    """--train-env-vars: a JSON object of environment variables (values made strings)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object of variables, got {text!r}")
    return {str(k): str(v) for k, v in value.items()}


def add_train_option_arguments(parser: argparse.ArgumentParser) -> None:
    """slime's flags of trainable parameters, optimizer resets, the reference, the trainer's processes; refusals."""
    g = parser.add_argument_group("slime's trainer flags (docs/migrating-from-slime.md)")
    g.add_argument(
        "--only-train-params-name-list",
        nargs="*",
        default=None,
        metavar="REGEX",
        help="train only the parameters whose Megatron name matches one of these (re.search); the rest is frozen",
    )
    g.add_argument(
        "--freeze-params-name-list",
        nargs="*",
        default=None,
        metavar="REGEX",
        help="freeze the parameters whose Megatron name matches one of these (re.search), e.g. embedding output_layer",
    )
    g.add_argument(
        "--freeze-indexer", action="store_true", help="freeze the DSA indexer's parameters (DeepSeek-V3.2, GLM-5)"
    )
    g.add_argument(
        "--reset-optimizer-states",
        action="store_true",
        help="clear Adam's moments and step counts before each rollout's optimizer steps, as slime",
    )
    g.add_argument(
        "--ref-update-interval",
        type=int,
        default=None,
        metavar="N",
        help="every N rollouts the KL reference becomes the trained policy's weights (default: never)",
    )
    g.add_argument(
        "--use-stateless-adam",
        action="store_true",
        help="Adam keeps no moments: each step is Adam's first step from zero moments, lr * g / (|g| + eps) plus "
        "decoupled weight decay, as slime (needs --optimizer adam and --no-save-optim)",
    )
    g.add_argument(
        "--keep-old-actor",
        action="store_true",
        help="keep the weights that generated each rollout on the trainer (slime's old_actor/rollout_actor, rotated "
        "at every weight update) and take the old policy's log-probs from them: for train_async, whose rollouts "
        "come from the weights one update older (slime_like/trainer/old_actor.py)",
    )
    g.add_argument(
        "--release-train",
        action="store_true",
        help="end the trainer ranks' processes after each weight update and rebuild them from the newest --save "
        "checkpoint before the next train, as slime (needs --save and --update-weight-transport disk; saves every "
        "rollout): no trainer memory is held while the engines generate",
    )
    g.add_argument(
        "--use-rollout-entropy",
        action="store_true",
        help="the old policy's log-prob forward also computes each response token's entropy: in the rollout data "
        "(slime's rollout_data['entropy'], for a --rollout-data-postprocess-path hook) and logged as rollout/entropy",
    )
    g.add_argument(
        "--train-env-vars",
        type=json_env,
        default={},
        help='JSON object of environment variables for the trainer ranks, e.g. \'{"PYTORCH_CUDA_ALLOC_CONF": '
        '"expandable_segments:True"}\'',
    )
    g.add_argument(
        "--distributed-backend",
        default="nccl",
        choices=["nccl", "gloo"],
        help="torch.distributed backend of the trainer ranks on GPU (on CPU it is gloo)",
    )
    g.add_argument(
        "--distributed-timeout-minutes",
        type=int,
        default=10,
        help="timeout in minutes of the trainer ranks' collectives (slime's default)",
    )
    n = parser.add_argument_group("slime's trainer flags not supported here (each is an error naming why)")
    for flag, why in REFUSED:
        add_refused(n, flag, why)


def validate_train_options(args: argparse.Namespace) -> None:
    """Check the patterns and intervals, naming the flag."""
    from slime_like.core.errors import ArgumentError

    for flag in ("--only-train-params-name-list", "--freeze-params-name-list"):
        for pattern in getattr(args, _dest(flag)) or []:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ArgumentError(f"{flag} {pattern!r}: not a regular expression ({exc})") from None
    if args.ref_update_interval is not None:
        if args.ref_update_interval < 1:
            raise ArgumentError(f"--ref-update-interval {args.ref_update_interval} must be >= 1")
        if not (args.use_kl_loss or args.kl_coef):
            raise ArgumentError(
                "--ref-update-interval refreshes the KL reference, which this run does not keep: add --use-kl-loss "
                "(or --kl-coef)"
            )
    if args.use_rollout_entropy and args.use_routing_replay and not args.use_rollout_routing_replay:
        raise ArgumentError(
            "--use-rollout-entropy with --use-routing-replay: the old-policy forward that records the routing "
            "returns no entropies yet (with --use-rollout-routing-replay it does)"
        )
    if args.use_stateless_adam:
        if args.optimizer != "adam" or not args.no_save_optim:
            raise ArgumentError("--use-stateless-adam needs --optimizer adam and --no-save-optim (as slime: it keeps "
                                "no moments to save)")  # fmt: skip
        offload = [f for f in ("optimizer_cpu_offload", "use_precision_aware_optimizer") if getattr(args, f, False)]
        if offload:
            raise ArgumentError(f"--use-stateless-adam with --{offload[0].replace('_', '-')}: not supported here "
                                "(that optimizer is not a plain Adam to replace; slime patches it)")  # fmt: skip
    if args.release_train:
        validate_release_train(args)
    if args.distributed_timeout_minutes < 1:
        raise ArgumentError(f"--distributed-timeout-minutes {args.distributed_timeout_minutes} must be >= 1")


def validate_release_train(args: argparse.Namespace) -> None:
    """--release-train's needs, as slime checks them (slime/utils/arguments.py), and why."""
    from slime_like.core.errors import ArgumentError

    if not args.save:
        raise ArgumentError("--release-train rebuilds the trainer from its checkpoint after each rollout: add --save")
    if args.update_weight_transport != "disk" or args.update_weight_mode != "full":
        raise ArgumentError("--release-train needs --update-weight-transport disk (and --update-weight-mode full), "
                            "as slime: the engines reload the weights the released trainer wrote")  # fmt: skip
    clashes = [
        ("--keep-old-actor", args.keep_old_actor, "the kept weights would die with the ranks (slime refuses it too)"),
        ("a PPO critic", args.advantage_estimator == "ppo", "slime does not support it either"),
        ("--fully-async", args.fully_async, "generation never stops, so the trainer has no rollout to step out of"),
    ]
    for what, given, why in clashes:
        if given:
            raise ArgumentError(f"--release-train with {what}: not supported, {why}")
    args.save_interval = 1  # slime saves every rollout: the next ranks load it
    if args.offload_train:  # nothing to offload: the ranks are gone during rollouts
        args.start_warnings.append("--release-train: --offload-train is off (the trainer's processes end instead)")
        args.offload_train = False


def trainable_filter(args: Any) -> Callable[[str], bool] | None:
    """Whether a parameter (by Megatron name) trains under the freeze flags, slime's rules in slime's order; None
    when no flag freezes anything."""
    only = getattr(args, "only_train_params_name_list", None)
    frozen = getattr(args, "freeze_params_name_list", None)
    indexer = getattr(args, "freeze_indexer", False)
    if not (only or frozen or indexer):
        return None

    def trains(name: str) -> bool:
        if only and not any(re.search(p, name) for p in only):
            return False
        if frozen and any(re.search(p, name) for p in frozen):
            return False
        return not (indexer and is_indexer_parameter(name))

    return trains


def is_indexer_parameter(name: str) -> bool:
    """Whether a Megatron parameter belongs to a DSA indexer (megatron-core's `self_attention...indexer.*`)."""
    parts = name.split(".")
    return "self_attention" in parts and "indexer" in parts[parts.index("self_attention") + 1 :]


def freeze_callback(trains: Callable[[str], bool], indexer: bool = False) -> Callable[..., None]:
    """An mbridge post-creation callback that sets requires_grad by `trains` before DDP and the optimizer see the
    parameters (as slime's model provider does)."""

    def freeze(model: Any, pre_process: bool, post_process: bool, config: Any, hf_config: Any) -> None:
        names = [name for name, _ in model.named_parameters()]
        for name, param in model.named_parameters():
            param.requires_grad = param.requires_grad and trains(name)
        attention = any("self_attention" in n.split(".") for n in names)
        if indexer and attention and not any(is_indexer_parameter(n) for n in names):
            raise RuntimeError("--freeze-indexer: this model has attention but no DSA indexer parameters")

    return freeze


def reset_optimizer_states(optimizer: Any) -> None:
    """Zero Adam's moments and step counts (slime's --reset-optimizer-states), in every chained optimizer."""
    import torch

    for chained in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        inner = getattr(chained, "optimizer", chained)
        for group in inner.param_groups:
            if "step" in group:
                group["step"] = 0
        for state in inner.state.values():
            if "step" in state:
                if isinstance(state["step"], torch.Tensor):
                    state["step"].zero_()
                else:
                    state["step"] = 0
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state:
                    state[key].zero_()


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")
