"""Multi-LoRA flags (miles' names): `--multi-lora-adapter NAME CONFIG` (repeatable) trains one adapter per NAME over
the one frozen base, each on the prompts its CONFIG names; `--multi-lora-n-adapters N` is the slot capacity.

`--multi-lora-eval-adapter NAME` (a flag of this project, not miles') names the adapter that generates the eval
samples (rollout/evaluation.py tags them).

CONFIG is a YAML (or JSON) file in the shape of miles' adapter.yaml: `data` (the adapter's prompt file) is needed;
`input_key`, `label_key` and `adapter_path` (an HF PEFT adapter to start from) are optional; `rank` and `alpha`, when
given, must equal --lora-rank and --lora-alpha (the adapters share one shape). Keys for things a run sets for all
adapters alike (batch shape, reward, stop step) are refused with the flag to use. Importing this is cheap (no torch).
"""

from __future__ import annotations

import argparse
import math
import os
import re
from typing import Any

DATA_SOURCE = "rollout.lora_data.multi_lora_source"  # the --data-source-path a multi-LoRA run uses
ALLOWED_KEYS = ("data", "input_key", "label_key", "adapter_path", "rank", "alpha")
# miles' adapter.yaml keys a run here sets once for every adapter, and the flag that does.
RUN_WIDE_KEYS = {
    "rollout_batch_size": "--rollout-batch-size (groups are drawn from the adapters in turn)",
    "n_samples_per_prompt": "--n-samples-per-prompt",
    "rm_type": "--rm-type / --custom-rm-path (a custom one can read metadata['lora_adapter'])",
    "custom_rm_path": "--custom-rm-path (it can read metadata['lora_adapter'])",
    "num_step": "--num-rollout",
    "num_epoch": "--num-epoch / --num-rollout",
    "save": "--save (each adapter is saved under <save>/lora/<name>/)",
}
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def add_multi_lora_arguments(group: argparse._ArgumentGroup) -> None:
    """miles' multi-LoRA flags, in the LoRA group."""
    group.add_argument(
        "--multi-lora-n-adapters", type=int, default=0,
        help="adapter slots per SGLang batch in a multi-LoRA run (default: the number of --multi-lora-adapter)",
    )  # fmt: skip
    group.add_argument(
        "--multi-lora-adapter", nargs=2, action="append", default=None, dest="multi_lora_adapters",
        metavar=("NAME", "CONFIG"),
        help="train an adapter NAME on the prompts of CONFIG (YAML: data, optional input_key, label_key, "
        "adapter_path); repeat for each adapter (docs/lora.md)",
    )  # fmt: skip
    group.add_argument(
        "--multi-lora-eval-adapter", default=None, metavar="NAME",
        help="the adapter that generates the eval samples of a multi-LoRA run (needed with --eval-prompt-data or "
        "--eval-config): each eval sample is tagged with it, as a training sample is with its own",
    )  # fmt: skip


def read_adapter_config(name: str, path: str) -> dict[str, Any]:
    """One adapter's CONFIG file, checked: a dict with `data` and only the keys this run can honour per adapter."""
    import yaml

    flag = f"--multi-lora-adapter {name} {path}"
    try:
        with open(path, encoding="utf-8") as f:
            config = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{flag}: cannot read the adapter config: {exc}") from exc
    if not isinstance(config, dict) or not config.get("data"):
        raise ValueError(f"{flag}: the config needs `data: <prompt file>` (a YAML mapping like miles' adapter.yaml)")
    for key in config:
        if key in RUN_WIDE_KEYS:
            raise ValueError(f"{flag}: `{key}` is set for all adapters at once here: use {RUN_WIDE_KEYS[key]}")
        if key not in ALLOWED_KEYS:
            raise ValueError(f"{flag}: unknown key `{key}`; an adapter config takes {', '.join(ALLOWED_KEYS)}")
    base = os.path.dirname(os.path.abspath(path))  # relative paths are relative to the config file
    for key in ("data", "adapter_path"):
        if key in config:
            config[key] = os.path.join(base, str(config[key]))
    if not os.path.isfile(config["data"]):
        raise ValueError(f"{flag}: data file {config['data']} does not exist")
    start = config.get("adapter_path")
    if start is not None and not os.path.isfile(os.path.join(start, "adapter_config.json")):
        raise ValueError(f"{flag}: adapter_path {start}: no adapter_config.json there (an HF PEFT adapter)")
    return config


def validate_multi_lora_args(args: argparse.Namespace) -> None:
    """Check the multi-LoRA flags, read each adapter's config and route the prompts through the per-adapter data
    source. Runs before the rollout flags are checked: that source stands in for --prompt-data."""
    from slime_like.core.errors import ArgumentError

    entries = getattr(args, "multi_lora_adapters", None) or []
    slots = getattr(args, "multi_lora_n_adapters", 0)
    evaluator = getattr(args, "multi_lora_eval_adapter", None)
    args.lora_adapter_names, args.multi_lora_configs = [], {}
    if not entries:
        for flag, given in (("--multi-lora-n-adapters", slots), ("--multi-lora-eval-adapter", evaluator)):
            if given:
                raise ArgumentError(f"{flag} {given} needs adapters: add --multi-lora-adapter NAME CONFIG")
        return
    why = " (a multi-LoRA run: docs/lora.md, 'Several adapters')"
    if not args.lora_rank:
        raise ArgumentError("--multi-lora-adapter needs --lora-rank and --target-modules: the adapters' shape" + why)
    names = [name for name, _ in entries]
    for name in names:
        if not NAME.fullmatch(name) or name == "policy":
            raise ArgumentError(
                f"--multi-lora-adapter {name!r}: a name is letters, digits, '_', '.', '-' (not 'policy', the "
                "single-adapter name)" + why
            )
    if len(set(names)) != len(names):
        raise ArgumentError(f"--multi-lora-adapter names must differ: {', '.join(names)}")
    if slots and slots < len(names):
        raise ArgumentError(
            f"--multi-lora-n-adapters {slots} is below the {len(names)} adapters given: raise it to {len(names)}"
        )
    conflicts = {
        "--prompt-data": args.prompt_data,
        "--data-source-path": getattr(args, "data_source_path", None),
        "--lora-adapter-path (use adapter_path in each adapter's config)": args.lora_adapter_path,
        "--advantage-estimator ppo (one critic cannot serve several adapters)": (
            getattr(args, "advantage_estimator", None) == "ppo"
        ),
    }
    for flag, given in conflicts.items():
        if given:
            raise ArgumentError(f"--multi-lora-adapter with {flag}: drop one of them" + why)
    if evaluator is not None and evaluator not in names:
        raise ArgumentError(f"--multi-lora-eval-adapter {evaluator}: not an adapter of this run ({', '.join(names)})")
    evaluated = getattr(args, "eval_prompt_data", None) or getattr(args, "eval_config", None)
    if evaluated and evaluator is None:
        raise ArgumentError(
            "--multi-lora-adapter with --eval-prompt-data / --eval-config: name the adapter that generates the eval "
            f"samples with --multi-lora-eval-adapter NAME (one of {', '.join(names)})" + why
        )
    for name, path in entries:
        try:
            config = read_adapter_config(name, path)
        except ValueError as exc:
            raise ArgumentError(str(exc)) from exc
        for key, flag, value in (("rank", "--lora-rank", args.lora_rank), ("alpha", "--lora-alpha", args.lora_alpha)):
            if key in config and not math.isclose(float(config[key]), float(value)):
                raise ArgumentError(
                    f"--multi-lora-adapter {name} {path}: {key} {config[key]} differs from {flag} {value:g}; the "
                    f"adapters of a run share one shape: drop `{key}` or set {flag} {config[key]}"
                )
        args.multi_lora_configs[name] = config
    started = [name for name in names if args.multi_lora_configs[name].get("adapter_path")]
    if started and len(names) > 1 and (getattr(args, "use_kl_loss", False) or getattr(args, "kl_coef", 0)):
        raise ArgumentError(
            "--multi-lora-adapter with --use-kl-loss / --kl-coef and adapters that start from an adapter_path "
            f"({', '.join(started)}): the KL reference is one snapshot, the base with the adapter live at start, "
            "not each adapter's own start; start every adapter fresh or drop the KL term" + why
        )
    args.lora_adapter_names = names
    args.multi_lora_n_adapters = slots or len(names)
    args.data_source_path = DATA_SOURCE
