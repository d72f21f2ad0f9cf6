"""Flags of rollout: SGLang servers, sampling, dynamic sampling, reward, plugins, evaluation."""

from __future__ import annotations

import argparse
from typing import Any

from buffer.arguments import resolve_num_rollout
from rollout.eval_config import resolve_eval_datasets
from rollout.rm_types import REFUSED_RM_TYPES, RM_TYPES

# /pause_generation modes of SGLang (weight updates under --fully-async).
PAUSE_MODES = ("abort", "retract", "in_place")
# slime's fully-async rollout function: it runs as --fully-async here (docs/fully-async.md).
SLIME_FULLY_ASYNC = "slime.rollout.fully_async_rollout.generate_rollout_fully_async"


def add_rollout_arguments(parser: argparse.ArgumentParser) -> None:
    """Rollout, SGLang, reward, plugin and eval flags (unknown `--sglang-X` flags are passed to SGLang as `--X`)."""
    g = parser.add_argument_group("rollout")
    g.add_argument(
        "--rollout-num-gpus",
        type=int,
        default=None,
        help="devices for rollout (SGLang servers on CPU); default: with --colocate the trainer's (--actor-num-nodes "
        "x --actor-num-gpus-per-node), as slime; without it 1",
    )
    g.add_argument("--rollout-num-gpus-per-engine", type=int, default=1, help="SGLang tensor parallel size")
    g.add_argument("--rollout-temperature", type=float, default=1.0)
    g.add_argument("--rollout-top-p", type=float, default=1.0)
    g.add_argument("--rollout-top-k", type=int, default=-1)
    g.add_argument("--rollout-max-response-len", type=int, default=1024)
    g.add_argument(
        "--rollout-max-context-len",
        type=int,
        default=None,
        help="most prompt + response tokens of a sample: generation stops there (and --rollout-max-prompt-len "
        "defaults to one less), as slime",
    )
    g.add_argument("--rollout-stop", nargs="*", default=None, help="stop strings")
    g.add_argument("--rollout-stop-token-ids", nargs="*", type=int, default=None)
    g.add_argument(
        "--sglang-server-concurrency",
        type=int,
        default=512,
        help="in-flight requests per server (x servers in all); 512 as slime",
    )
    g.add_argument("--rollout-request-timeout", type=float, default=600.0, help="seconds per /generate request")
    g.add_argument("--sglang-startup-timeout", type=float, default=180.0)
    g.add_argument(
        "--prefill-num-servers",
        type=int,
        default=None,
        help="slime's prefill/decode disaggregation: not supported (the error says what is missing)",
    )
    g.add_argument(
        "--sglang-config",
        default=None,
        help="slime's YAML of named models served in one run (policy, teacher, reward model): rollout/model_groups.py",
    )
    g.add_argument(
        "--router-policy",
        default="round_robin",
        choices=["round_robin", "cache_aware", "random", "power_of_two"],
        help="how sglang-router spreads requests (cache_aware keeps a prefix on one server: good for multi-turn)",
    )
    f = parser.add_argument_group("fault tolerance (slime's names and defaults)")
    f.add_argument(
        "--use-fault-tolerance",
        action="store_true",
        help="watch every engine (/health_generate); a dead or hung one leaves the router, is restarted on its "
        "slots and rejoins at the next weight update with the trainer's weights; generate requests it held are "
        "retried on the others",
    )
    f.add_argument("--rollout-health-check-interval", type=float, default=30.0, help="seconds between checks")
    f.add_argument(
        "--rollout-health-check-timeout", type=float, default=30.0, help="seconds an engine has to answer a check"
    )
    f.add_argument("--rollout-health-check-first-wait", type=float, default=0.0, help="seconds before the first check")
    d = parser.add_argument_group("dynamic sampling and partial rollout")
    d.add_argument(
        "--over-sampling-batch-size",
        type=int,
        default=None,
        help="groups started at a time until --rollout-batch-size groups pass the dynamic filter (default: that size)",
    )
    d.add_argument(
        "--partial-rollout",
        action="store_true",
        help="return groups still generating at the end of a rollout to the buffer, to be continued later",
    )
    d.add_argument(
        "--mask-offpolicy-in-partial-rollout",
        action="store_true",
        help="with --partial-rollout: tokens generated in an earlier rollout get loss mask 0",
    )
    a = parser.add_argument_group("fully asynchronous rollout (python -m slime_like.train_async --fully-async)")
    a.add_argument(
        "--fully-async",
        action="store_true",
        help="engines generate continuously into a queue; each step trains the next --rollout-batch-size finished "
        "groups and weights are pushed while generation is paused (docs/fully-async.md)",
    )
    a.add_argument(
        "--pause-generation-mode",
        default="abort",
        choices=PAUSE_MODES,
        help="how generation pauses for a weight update: abort (in-flight requests return their tokens and "
        "continue after the update; SGLang's and slime's default), retract (requeued inside the engine, their KV "
        "cache recomputed) or in_place (kept with their KV cache of the old weights)",
    )
    a.add_argument(
        "--max-weight-staleness",
        type=int,
        default=None,
        help="with --fully-async: a group trains only if every token was generated by a weight version at most N "
        "behind the one it trains on (default: unbounded, as slime)",
    )
    a.add_argument(
        "--max-inflight-groups",
        type=int,
        default=None,
        help="with --fully-async: groups generating at once (default --rollout-batch-size, as AReaL's "
        "max_concurrent_rollouts); fewer keep long responses within --max-weight-staleness (docs/fully-async.md)",
    )
    a.add_argument(
        "--stale-group-policy",
        default="regenerate",
        choices=["regenerate", "drop"],
        help="a group over --max-weight-staleness is generated again from its prompt, or dropped (counted)",
    )
    p = parser.add_argument_group("plugins (dotted paths; signatures in docs/plugins.md)")
    p.add_argument("--rollout-function-path", default=None, help="async (ctx, rollout_id, buffer) -> groups")
    p.add_argument(
        "--custom-generate-function-path", default=None, help="async (ctx, sample, sampling_params) -> Sample"
    )
    p.add_argument(
        "--group-generate",
        action="store_true",
        help="the custom generate function takes a whole group: async (ctx, group, sampling_params) -> group",
    )
    p.add_argument(
        "--rollout-sample-hook-path",
        action="append",
        default=[],
        help="repeatable; (args, sample, *, rollout_id=None, evaluation=False) -> Sample | None, plain or async, "
        "applied in order to each generated sample before it is scored",
    )
    p.add_argument(
        "--openai-strict-history",
        action="store_true",
        help="the agents' endpoint answers 400 to a call that does not extend its session's history, instead of "
        "branching the session (rollout/openai_session.py)",
    )
    p.add_argument(
        "--openai-branch-reward",
        default="run",
        choices=["run", "branch"],
        help="an agent run whose history branched gives one sample per branch: each carries the run's reward (run), "
        "or the reward function scores each branch (branch)",
    )
    p.add_argument("--dynamic-sampling-filter-path", default=None, help="(args, group) -> bool | FilterResult")
    p.add_argument(
        "--loss-mask-type",
        default="qwen",
        choices=["qwen", "qwen3", "qwen3_5", "distill_qwen"],
        help="how slime.rollout.sft_rollout masks chat turns (slime.utils.mask_utils); 1 on the assistant's",
    )
    p.add_argument("--buffer-filter-path", default=None, help="(args, returned_groups, num_groups) -> groups")
    p.add_argument("--rollout-sample-filter-path", default=None, help="(args, group) -> list[bool] (False: no loss)")
    p.add_argument(
        "--custom-convert-samples-to-train-data-path",
        default=None,
        help="slime's (args, samples) -> dict of train-data keys, replacing the built-in conversion "
        "(rollout/slime_train_data.py)",
    )
    p.add_argument(
        "--rollout-all-samples-process-path",
        default=None,
        help="slime's (args, all_groups, data_source) -> None, after the built-in rollout: every group it generated, "
        "the dynamic filter's drops included",
    )
    p.add_argument(
        "--custom-reward-post-process-path", default=None, help="(args, group) -> list[float], rewards for training"
    )
    p.add_argument("--eval-function-path", default=None, help="async (ctx, rollout_id, datasets) -> metrics")
    p.add_argument(
        "--custom-rollout-log-function-path",
        default=None,
        help="slime's (rollout_id, args, samples, extra_metrics, rollout_time) -> bool: True skips the default "
        "sample metrics (rollout/log_hooks.py)",
    )
    p.add_argument(
        "--custom-eval-rollout-log-function-path",
        default=None,
        help="slime's (rollout_id, args, data, extra_metrics) -> bool: True skips the per-dataset eval metrics",
    )
    p.add_argument(
        "--plugin-api",
        default="auto",
        choices=["auto", "native", "slime"],
        help="which contract hooks follow: auto = slime's for a hook whose module imports slime, else ours",
    )
    r = parser.add_argument_group("reward")
    r.add_argument("--rm-type", default="math", choices=RM_TYPES + tuple(REFUSED_RM_TYPES),
                   help="built-in reward (see docs/plugins.md); slime's ifbench is refused, naming why")  # fmt: skip
    r.add_argument("--custom-rm-path", default=None, help="(args, sample) -> reward, sync or async")
    r.add_argument("--group-rm", action="store_true", help="--custom-rm-path scores a group: (args, group) -> rewards")
    r.add_argument("--reward-key", default=None, help="key of the training reward when rewards are dicts")
    r.add_argument("--rm-url", default=None, help="--rm-type remote: URL the reward requests are POSTed to")
    r.add_argument("--rm-timeout", type=float, default=60.0, help="seconds per reward call (per HTTP attempt: remote)")
    r.add_argument("--rm-retries", type=int, default=3, help="--rm-type remote: retries after a failed attempt")
    r.add_argument(
        "--rm-num-workers", type=int, default=2, help="worker processes for math_verify / reasoning_gym scoring"
    )
    e = parser.add_argument_group("eval")
    e.add_argument(
        "--eval-prompt-data",
        nargs="+",
        default=None,
        metavar="NAME PATH",
        help="eval datasets as name/path pairs (`aime a.jsonl gsm8k g.jsonl`), or one path",
    )
    e.add_argument(
        "--eval-config",
        default=None,
        help="slime's eval YAML (eval: {defaults: {...}, datasets: [{name, path, ...}]}); replaces --eval-prompt-data",
    )
    e.add_argument("--eval-input-key", default=None, help="row key of eval prompts (default --input-key)")
    e.add_argument("--eval-label-key", default=None, help="row key of eval labels (default --label-key)")
    e.add_argument("--eval-interval", type=int, default=None, help="evaluate every N rollouts (and before the first)")
    e.add_argument("--n-samples-per-eval-prompt", type=int, default=1, help="samples per eval prompt (pass@k)")
    # Unset, each falls back to its rollout counterpart, as in slime (pass --eval-temperature 0 for greedy).
    e.add_argument("--eval-temperature", type=float, default=None, help="default --rollout-temperature")
    e.add_argument("--eval-top-p", type=float, default=None, help="default --rollout-top-p")
    e.add_argument("--eval-top-k", type=int, default=None, help="default --rollout-top-k")
    e.add_argument("--eval-max-response-len", type=int, default=None, help="default --rollout-max-response-len")
    e.add_argument(
        "--eval-pass-threshold", type=float, default=1.0, help="an eval sample passes (pass@k) at this reward or above"
    )


def validate_rollout_args(args: argparse.Namespace) -> None:
    """Fill rollout defaults, reject contradictions and load every plugin (raises ValueError naming the flag)."""
    if not getattr(args, "rollout_global_dataset", True):
        if not args.rollout_function_path:
            raise ValueError(
                "--disable-rollout-global-dataset leaves the run without prompts (the data source serves empty "
                "samples): it needs --rollout-function-path naming a rollout function that supplies its own data "
                "(slime's built-in rollout refuses the flag too)"
            )
    elif not args.prompt_data and not args.data_source_path:
        raise ValueError("the training prompts are missing: set --prompt-data FILE (or --data-source-path)")
    if args.prefill_num_servers is not None:
        raise ValueError(
            "--prefill-num-servers (prefill/decode disaggregation) is not supported: SGLang moves the KV cache from "
            "prefill to decode engines with a transfer engine (mooncake or nixl, over RDMA/UCX), which is not "
            "installed here and has no CPU path; nor do the engines here start in --disaggregation-mode or the "
            "router in --pd-disaggregation yet. Drop the flag: every engine prefills and decodes"
        )
    if args.sglang_config is not None:
        from rollout.model_groups import load_model_groups

        load_model_groups(args)  # checked now, before anything starts; the rollout manager reads it again
    if args.rollout_max_context_len is not None:
        if args.rollout_max_context_len < 2:
            raise ValueError(f"--rollout-max-context-len {args.rollout_max_context_len} leaves no room for a response")
        if args.rollout_max_prompt_len is None:
            args.rollout_max_prompt_len = args.rollout_max_context_len - 1
        elif args.rollout_max_prompt_len >= args.rollout_max_context_len:
            raise ValueError(
                f"--rollout-max-prompt-len {args.rollout_max_prompt_len} must be below --rollout-max-context-len "
                f"{args.rollout_max_context_len}"
            )
    if args.rollout_temperature <= 0:
        # Training divides the logits by the rollout's temperature to get the rollout policy's log-probs.
        raise ValueError(
            f"--rollout-temperature {args.rollout_temperature}: training needs the sampling policy's log-probs, "
            "which a temperature of 0 does not have; for near-greedy rollouts use --rollout-top-k 1 (at a "
            "temperature above 0). Greedy evaluation is --eval-temperature 0"
        )
    validate_fully_async_args(args)
    if args.over_sampling_batch_size is None:
        args.over_sampling_batch_size = args.rollout_batch_size
    if args.over_sampling_batch_size < 1:
        raise ValueError(f"--over-sampling-batch-size must be at least 1, got {args.over_sampling_batch_size}")
    if args.mask_offpolicy_in_partial_rollout and not (args.partial_rollout or args.fully_async):
        raise ValueError("--mask-offpolicy-in-partial-rollout needs --partial-rollout (or --fully-async)")
    if args.group_generate and not args.custom_generate_function_path:
        raise ValueError("--group-generate needs --custom-generate-function-path")
    if args.group_rm and not args.custom_rm_path:
        raise ValueError("--group-rm needs --custom-rm-path (the built-in rewards score one sample at a time)")
    if args.rm_type in REFUSED_RM_TYPES and not args.custom_rm_path:
        raise ValueError(f"--rm-type {args.rm_type} is not supported here: {REFUSED_RM_TYPES[args.rm_type]}")
    if args.rm_type == "remote" and not args.custom_rm_path and not args.rm_url:
        raise ValueError("--rm-type remote needs --rm-url")
    # With --sglang-config the one frozen model's router becomes --rm-url when the fleet starts (rollout/fleet_plan.py).
    opd_reward = (args.custom_rm_path or "").startswith("slime.rollout.on_policy_distillation.")
    if opd_reward and not args.rm_url and not args.sglang_config:
        raise ValueError(
            f"--custom-rm-path {args.custom_rm_path} asks the teacher for its log-probs at --rm-url: set --rm-url "
            "to the teacher server's /generate URL (e.g. http://127.0.0.1:13141/generate), or serve the teacher "
            "in the run with --sglang-config"
        )
    resolve_num_rollout(args)
    if args.n_samples_per_eval_prompt < 1:
        raise ValueError("--n-samples-per-eval-prompt must be at least 1")
    resolve_eval_datasets(args, RM_TYPES)  # --eval-config or --eval-prompt-data: eval_datasets, each one's config
    if args.eval_interval is not None and not args.eval_datasets:
        raise ValueError("--eval-interval needs eval datasets: --eval-prompt-data NAME PATH or --eval-config YAML")
    from rollout.hooks import load_hooks

    load_hooks(args)  # fails here, before Ray or any server starts, with the flag in the message


def validate_fully_async_args(args: argparse.Namespace) -> None:
    """--fully-async and its flags: slime's fully-async rollout function turns it on; contradictions are errors."""
    if args.rollout_function_path == SLIME_FULLY_ASYNC:
        args.fully_async, args.rollout_function_path = True, None
    if args.max_weight_staleness is not None and args.max_weight_staleness < 0:
        raise ValueError(f"--max-weight-staleness {args.max_weight_staleness} must be 0 or more")
    if args.max_inflight_groups is not None and args.max_inflight_groups < 1:
        raise ValueError(f"--max-inflight-groups {args.max_inflight_groups} must be 1 or more")
    if not args.fully_async:
        for flag in ("max_weight_staleness", "max_inflight_groups"):
            if getattr(args, flag) is not None:
                raise ValueError(f"--{flag.replace('_', '-')} applies to --fully-async only: add --fully-async")
        return
    if getattr(args, "colocate", False):
        raise ValueError("--fully-async generates while the trainer trains: it needs separate devices, drop --colocate")
    if args.rollout_function_path:
        raise ValueError(
            f"--fully-async runs its own continuous rollout: drop --rollout-function-path {args.rollout_function_path}"
            " (the generate, reward and filter plugins still apply)"
        )
    if args.over_sampling_batch_size is not None:
        raise ValueError(
            "--over-sampling-batch-size sizes the draws of one rollout; --fully-async starts groups as the engines "
            "take them (docs/fully-async.md): drop it"
        )
    from rollout.pause import server_args

    # The SGLang flags that keep retract/in_place pauses exact (rollout/pause.py), for every engine started here.
    given = list(getattr(args, "sglang_server_args", None) or [])
    args.sglang_server_args = given + [f for f in server_args(args.pause_generation_mode) if f not in given]


def eval_data_keys(args: Any) -> tuple[str, str | None]:
    """(input key, label key) of the eval datasets: --eval-input-key/--eval-label-key, else the training ones."""
    input_key = args.eval_input_key if args.eval_input_key is not None else args.input_key
    label_key = args.eval_label_key if args.eval_label_key is not None else args.label_key
    return input_key, label_key


SGLANG_DTYPE_ALIASES = {"half": "float16", "float": "float32"}


def server_dtype(args: Any) -> str:
    """The SGLang servers' --dtype: always the trainer's precision (bfloat16 with --bf16, else float32)."""
    return "bfloat16" if args.bf16 else "float32"


def server_arg(args: Any, flag: str) -> str | None:
    """The value of an SGLang server flag the user passed as --sglang-<flag> (None when not given)."""
    flags = list(getattr(args, "sglang_server_args", None) or [])
    for i, token in enumerate(flags):
        if token.startswith(flag + "="):
            return token.split("=", 1)[1]
        if token == flag and i + 1 < len(flags):
            return flags[i + 1]
    return None


def requested_server_dtype(args: Any) -> str | None:
    """The --sglang-dtype the user passed, normalised (None when not given)."""
    value = server_arg(args, "--dtype")
    return None if value is None else SGLANG_DTYPE_ALIASES.get(value, value)


def sglang_passthrough(unknown: list[str]) -> tuple[list[str], list[str]]:
    """Split leftover flags into SGLang server args (`--sglang-X v` -> `--X v`) and the rest."""
    server_args: list[str] = []
    rest: list[str] = []
    target = rest
    for token in unknown:
        if token.startswith("--sglang-"):
            target = server_args
            token = "--" + token[len("--sglang-") :]
        elif token.startswith("--"):
            target = rest
        target.append(token)  # a value goes with the flag before it
    return server_args, rest
