"""slime's rollout-side flags beyond the core ones: chat template, eval per-dataset defaults, rollout metrics, and
slime's flags that cannot work here (each refused at start, naming why)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rollout.external_engines import add_external_engine_arguments, validate_external_engine_args
from slime_like.core.refused import add_refused

# slime flags that slime itself reads nowhere (or only as a transport choice that changes no result): accepted and
# named in the start-up line "accepted without effect here" (slime_like/trainer/megatron/flags.py), with why.
ROLLOUT_NO_EFFECT: tuple[tuple[str, dict[str, Any], str], ...] = (
    ("--http-proxy", {"default": None}, "slime reads it nowhere either; requests to the engines never use a proxy"),
    (
        "--use-distributed-post",
        {"action": "store_true"},
        "slime's pool of Ray actors for HTTP posts; requests go out from the rollout manager's aiohttp session",
    ),
    ("--min-batch-collection-ratio", {"type": float, "default": 1.0}, "slime reads it nowhere either"),
)

# Values slime's rollout-buffer example (slime_plugins/rollout_buffer, a --rollout-function-path) reads from args.
PLUGIN_SETTINGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("--rollout-buffer-url", {"default": None}),
    ("--rollout-task-type", {"default": "math"}),
    ("--fetch-trajectory-retry-times", {"type": int, "default": -1}),
)


def json_object(text: str) -> dict[str, Any]:
    """A JSON object given on the command line (slime's `type=json.loads` for mappings)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def add_slime_rollout_arguments(parser: argparse.ArgumentParser) -> None:
    """slime's chat-template, eval, rollout-metric and plugin-setting flags; its unsupported ones, refused."""
    g = parser.add_argument_group("slime's rollout flags (docs/migrating-from-slime.md)")
    g.add_argument(
        "--apply-chat-template-kwargs",
        type=json_object,
        default={},
        help="JSON object passed to the tokenizer's apply_chat_template with --apply-chat-template, e.g. "
        "'{\"enable_thinking\": false}'",
    )
    g.add_argument(
        "--rollout-skip-special-tokens",
        action="store_true",
        help="SGLang leaves special tokens out of each response's text (the tokens themselves are kept)",
    )
    g.add_argument(
        "--log-passrate",
        action="store_true",
        help="log pass@k of each rollout's groups (rollout/pass@k: a sample passes at --eval-pass-threshold)",
    )
    g.add_argument(
        "--log-reward-category",
        default=None,
        metavar="KEY",
        help="rewards are dicts: log the share of samples per value of reward[KEY] (error_cat/<value>), as slime",
    )
    g.add_argument(
        "--log-multi-turn",
        action="store_true",
        help="log multi_turn/*: response lengths with and without tool/environment tokens, and the samples' "
        "metadata['round_number'] (rollout/slime_stats.py)",
    )
    g.add_argument(
        "--log-correct-samples",
        action="store_true",
        help="log the samples of raw reward 1: their mean length, its share per quarter of "
        "--rollout-max-response-len (rollout/correct_length/p25...), their mean -log p (rollout/correct_entropy)",
    )
    g.add_argument(
        "--rollout-data-transport",
        default="object-store",
        choices=["object-store", "nixl"],
        help="object-store: each trainer rank fetches its share of the rollout from Ray's object store (the one "
        "transport here); nixl is refused",
    )
    for flag, kwargs in PLUGIN_SETTINGS:
        g.add_argument(flag, help="a setting of slime's rollout-buffer plugin: needs --rollout-function-path", **kwargs)
    for flag, kwargs, why in ROLLOUT_NO_EFFECT:
        g.add_argument(flag, help=f"accepted without effect: {why}", **kwargs)
    add_external_engine_arguments(g)  # --rollout-external-engine-addrs (rollout/external_engines.py)
    e = parser.add_argument_group("eval (slime's per-dataset defaults)")
    e.add_argument("--eval-max-prompt-len", type=int, default=None, help="eval prompts longer are skipped "
                   "(default --rollout-max-prompt-len)")  # fmt: skip
    e.add_argument("--eval-max-context-len", type=int, default=None, help="eval prompt + response stop there "
                   "(default --rollout-max-context-len)")  # fmt: skip
    e.add_argument("--eval-min-new-tokens", type=int, default=None, help="SGLang's min_new_tokens of eval requests")
    e.add_argument("--eval-reward-key", default=None, help="key of the eval reward when rewards are dicts "
                   "(default --reward-key)")  # fmt: skip
    e.add_argument("--eval-tool-key", default=None, help="row key of the eval datasets' tools (default --tool-key)")
    n = parser.add_argument_group("slime's rollout flags not supported here (each is an error naming why)")
    add_refused(
        n,
        "--load-forge-rollout-data",
        "slime.rollout.forge_load (replaying dumped .pt rollouts with the servers live) has no counterpart here; "
        "--load-debug-rollout-data replays dumps without servers",
    )


def validate_slime_rollout_args(args: argparse.Namespace) -> None:
    """Check the values of slime's rollout flags, naming the flag."""
    from slime_like.core.errors import ArgumentError

    given = [f for f, kw in PLUGIN_SETTINGS if getattr(args, _dest(f)) != kw["default"]]
    if given and not args.rollout_function_path:
        raise ArgumentError(
            f"{given[0]} is a setting of slime's rollout-buffer rollout function (slime_plugins/rollout_buffer), "
            "which reads it from args: it needs --rollout-function-path naming that function; nothing else reads it"
        )
    for flag in ("--eval-max-prompt-len", "--eval-max-context-len", "--eval-min-new-tokens"):
        value = getattr(args, _dest(flag))
        if value is not None and value < (0 if flag == "--eval-min-new-tokens" else 1):
            raise ArgumentError(f"{flag} {value} must be positive")
    if args.rollout_data_transport == "nixl":
        raise ArgumentError(
            "--rollout-data-transport nixl is not supported here: Ray's NIXL tensor transport is not wired in; "
            "rollouts reach the trainer ranks through Ray's object store (object-store)"
        )
    if args.apply_chat_template_kwargs and not args.apply_chat_template:
        raise ArgumentError("--apply-chat-template-kwargs are for the chat template: add --apply-chat-template")
    validate_external_engine_args(args)


def eval_reward_key(args: Any) -> str | None:
    """The key of the eval reward in dict rewards: --eval-reward-key, else --reward-key (as slime)."""
    key = getattr(args, "eval_reward_key", None)
    return key if key is not None else getattr(args, "reward_key", None)


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")
