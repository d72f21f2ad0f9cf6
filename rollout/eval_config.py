"""slime's eval datasets: `--eval-config` YAML or `--eval-prompt-data` pairs -> one EvalDatasetConfig per dataset.

Every field of slime's `EvalDatasetConfig` (slime/utils/eval_config.py) is read with slime's name and meaning, and
resolved as slime resolves it: the dataset's entry, else `eval.defaults`, else the flags slime falls back to (the
first of them that is set). A field slime's config does not have is an error naming it; so is a value of the wrong
type. How the eval uses each field: rollout/evaluation.py; what differs from slime: docs/migrating-from-slime.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from buffer.multimodal import parse_multimodal_keys
from rollout.rm_types import REFUSED_RM_TYPES, RM_TYPE_ALIASES

logger = logging.getLogger(__name__)

# Field -> the flags it falls back to when neither the dataset nor eval.defaults sets it (slime's arg_attrs; a flag
# this engine lacks reads as unset). Fields not listed have no fallback: unset is None.
FALLBACKS: dict[str, tuple[str, ...]] = {
    "n_samples_per_eval_prompt": ("n_samples_per_eval_prompt", "n_samples_per_prompt"),
    "temperature": ("eval_temperature", "rollout_temperature"),
    "top_p": ("eval_top_p", "rollout_top_p"),
    "top_k": ("eval_top_k", "rollout_top_k"),
    "max_response_len": ("eval_max_response_len", "rollout_max_response_len"),
    "stop": ("rollout_stop",),
    "stop_token_ids": ("rollout_stop_token_ids",),
    "min_new_tokens": ("eval_min_new_tokens",),
    "input_key": ("eval_input_key", "input_key"),
    "label_key": ("eval_label_key", "label_key"),
    "tool_key": ("eval_tool_key", "tool_key"),
    "metadata_key": ("metadata_key",),
    "multimodal_keys": ("multimodal_keys",),
    "apply_chat_template": ("apply_chat_template",),
    "apply_chat_template_kwargs": ("apply_chat_template_kwargs",),
    "custom_rm_path": ("eval_custom_rm_path", "custom_rm_path"),
}

# Fields slime's config declares and its eval never reads (slime/rollout/sglang_rollout.py): accepted, named once
# at start-up, and without effect, as in slime.
NO_EFFECT = (
    "app_service",
    "eval_task_timeout",
    "min_eval_samples",
    "eval_early_stop_remaining",
    "eval_early_stop_idle_timeout",
    "message_processor",
    "reward_model",
    "remote_environment",
)

# Sampling fields -> the SGLang sampling parameter each sets.
SAMPLING = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "max_response_len": "max_new_tokens",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "min_new_tokens": "min_new_tokens",
    "repetition_penalty": "repetition_penalty",
    "skip_special_tokens": "skip_special_tokens",
    "no_stop_trim": "no_stop_trim",
}

_NUMBER = (int, float)
# Field -> the types its value may have (None is always allowed: unset).
TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "path": (str,),
    "rm_type": (str,),
    "custom_rm_path": (str,),
    "input_key": (str,),
    "label_key": (str,),
    "tool_key": (str,),
    "metadata_key": (str,),
    "multimodal_keys": (dict,),
    "apply_chat_template": (bool,),
    "apply_chat_template_kwargs": (dict,),
    "n_samples_per_eval_prompt": (int,),
    "temperature": _NUMBER,
    "top_p": _NUMBER,
    "top_k": (int,),
    "max_response_len": (int,),
    "stop": (list,),
    "stop_token_ids": (list,),
    "min_new_tokens": (int,),
    "repetition_penalty": _NUMBER,
    "skip_special_tokens": (bool,),
    "no_stop_trim": (bool,),
    "custom_generate_function_path": (str,),
    "app_service": (str,),
    "eval_task_timeout": _NUMBER,
    "min_eval_samples": (int,),
    "eval_early_stop_remaining": (int,),
    "eval_early_stop_idle_timeout": _NUMBER,
    "message_processor": (dict,),
    "reward_model": (dict,),
    "remote_environment": (dict,),
    "metadata_overrides": (dict,),
}


@dataclass
class EvalDatasetConfig:
    """One eval dataset, with slime's fields (slime.utils.eval_config.EvalDatasetConfig), each resolved."""

    name: str
    path: str
    rm_type: str | None = None
    custom_rm_path: str | None = None
    input_key: str | None = None
    label_key: str | None = None
    tool_key: str | None = None
    metadata_key: str | None = None
    multimodal_keys: dict[str, str] | None = None
    apply_chat_template: bool | None = None
    apply_chat_template_kwargs: dict[str, Any] | None = None
    n_samples_per_eval_prompt: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_response_len: int | None = None
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    min_new_tokens: int | None = None
    repetition_penalty: float | None = None
    skip_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    custom_generate_function_path: str | None = None
    app_service: str | None = None
    eval_task_timeout: int | None = None
    min_eval_samples: int | None = None
    eval_early_stop_remaining: int | None = None
    eval_early_stop_idle_timeout: float | None = None
    message_processor: dict[str, Any] | None = None
    reward_model: dict[str, Any] | None = None
    remote_environment: dict[str, Any] | None = None
    metadata_overrides: dict[str, Any] = field(default_factory=dict)

    def inject_metadata(self, metadata: Any) -> dict[str, Any]:
        """A sample's metadata with the dataset's `rm_type` and `metadata_overrides` set (slime's inject_metadata)."""
        out = dict(metadata) if isinstance(metadata, dict) else {}
        if self.rm_type is not None:
            out["rm_type"] = self.rm_type
        out.update(self.metadata_overrides)
        return out

    def sampling_params(self, base: dict[str, Any]) -> dict[str, Any]:
        """`base` (the eval's sampling parameters from the flags) with this dataset's values set over it."""
        params = dict(base)
        for name, key in SAMPLING.items():
            value = getattr(self, name)
            if value is not None:
                params[key] = list(value) if isinstance(value, list) else value
        return params


FIELDS = tuple(f.name for f in fields(EvalDatasetConfig))


def _flag(args: Any, attrs: tuple[str, ...]) -> Any:
    """The first of `attrs` that is set on `args` (slime's pick_from_args), else None."""
    for attr in attrs:
        value = getattr(args, attr, None)
        if value is not None:
            return value
    return None


def _check(where: str, name: str, value: Any) -> None:
    """Raise ValueError when `value` is not of the field's type."""
    if name not in TYPES:
        raise ValueError(f"{where} sets {name!r}, which is not a field of slime's eval dataset config (fields: "
                         f"{', '.join(FIELDS)})")  # fmt: skip
    allowed = TYPES[name]
    ok = value is None or (isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed))
    if not ok:
        kinds = " or ".join(t.__name__ for t in allowed)
        raise ValueError(f"{where}: {name!r} must be {kinds}, got {type(value).__name__} {value!r}")


def build_dataset_configs(
    args: Any,
    entries: list[dict[str, Any]],
    defaults: dict[str, Any],
    source: str,
    rm_types: tuple[str, ...] | None = None,
) -> list[EvalDatasetConfig]:
    """One EvalDatasetConfig per entry: its value, else `defaults`', else its flags' (slime's resolution order)."""
    for name, value in defaults.items():
        _check(f"{source}: eval.defaults", name, value)
    configs = []
    for entry in entries:
        where = f"{source}: dataset {entry.get('name')!r}"
        for name, value in entry.items():
            _check(where, name, value)
        values = {name: entry.get(name, defaults.get(name)) for name in FIELDS if name in entry or name in defaults}
        for name, attrs in FALLBACKS.items():
            if values.get(name) is None and name not in entry and name not in defaults:
                values[name] = _flag(args, attrs)
        if values.get("metadata_overrides") is None:
            values["metadata_overrides"] = {}
        config = EvalDatasetConfig(**values)
        check_config(config, where, rm_types)
        configs.append(config)
    return configs


def check_config(config: EvalDatasetConfig, where: str, rm_types: tuple[str, ...] | None = None) -> None:
    """Raise ValueError for values this engine cannot honour (named with `where`); rm_type one of `rm_types`."""
    if config.rm_type is not None:
        config.rm_type = RM_TYPE_ALIASES.get(config.rm_type, config.rm_type)
        if config.rm_type in REFUSED_RM_TYPES:
            raise ValueError(f"{where}: rm_type {config.rm_type!r} is not supported here: "
                             f"{REFUSED_RM_TYPES[config.rm_type]}")  # fmt: skip
        if rm_types is not None and config.rm_type not in rm_types:
            raise ValueError(f"{where}: rm_type {config.rm_type!r} is not a built-in reward here (built in: "
                             f"{', '.join(rm_types)}); score it with custom_rm_path")  # fmt: skip
    if config.multimodal_keys:
        try:
            config.multimodal_keys = parse_multimodal_keys(config.multimodal_keys)
        except ValueError as exc:
            raise ValueError(f"{where}: multimodal_keys: {exc}") from None
    if config.n_samples_per_eval_prompt is not None and config.n_samples_per_eval_prompt < 1:
        raise ValueError(f"{where}: n_samples_per_eval_prompt must be at least 1")
    if config.min_eval_samples is not None and config.min_eval_samples <= 0:
        raise ValueError(f"{where}: min_eval_samples must be positive when set")  # slime's check
    if config.input_key is None:
        raise ValueError(f"{where}: no input_key (set it, --eval-input-key or --input-key)")


def read_eval_config(path: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The dataset entries and defaults of slime's eval YAML (`eval: {defaults, datasets}`, or those at the root)."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"--eval-config {path}: cannot read it as YAML ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"--eval-config {path}: expected a mapping at the root")
    section = data.get("eval", data)
    if not isinstance(section, dict):
        raise ValueError(f"--eval-config {path}: `eval` must be a mapping")
    unknown = sorted(set(section) - {"datasets", "defaults"})
    if unknown:
        raise ValueError(f"--eval-config {path}: unknown key(s) {unknown} in eval (expected datasets, defaults)")
    datasets = section.get("datasets")
    if isinstance(datasets, dict):  # slime also takes a mapping keyed by dataset name
        datasets = [{"name": name, **(spec or {})} for name, spec in datasets.items()]
    if not datasets or not isinstance(datasets, list) or not all(isinstance(d, dict) for d in datasets):
        raise ValueError(f"--eval-config {path}: expected eval.datasets, a list of entries with a name and a path")
    for entry in datasets:
        if not entry.get("name") or not entry.get("path"):
            raise ValueError(f"--eval-config {path}: every dataset needs a name and a path, got {entry}")
    defaults = section.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise ValueError(f"--eval-config {path}: eval.defaults must be a mapping")
    return [dict(d) for d in datasets], dict(defaults)


def eval_datasets(values: list[str] | None) -> list[tuple[str, str]]:
    """(name, path) pairs of --eval-prompt-data: one bare path is named after its file stem."""
    if not values:
        return []
    if len(values) == 1:
        return [(Path(values[0]).stem, values[0])]
    if len(values) % 2:
        raise ValueError(
            f"--eval-prompt-data takes one path or NAME PATH pairs; got {len(values)} values: {' '.join(values)}"
        )
    pairs = list(zip(values[::2], values[1::2], strict=True))
    names = [n for n, _ in pairs]
    if len(set(names)) != len(names):
        raise ValueError(f"--eval-prompt-data: dataset names must be unique, got {names}")
    return pairs


def resolve_eval_datasets(args: Any, rm_types: tuple[str, ...]) -> None:
    """Set `args.eval_datasets` ((name, path) pairs) and `args.eval_dataset_configs` from --eval-config (whose
    datasets replace --eval-prompt-data) or --eval-prompt-data (rm_type one of `rm_types`); raises ValueError."""
    entries: list[dict[str, Any]] = []
    defaults: dict[str, Any] = {}
    source = "--eval-prompt-data"
    if getattr(args, "eval_config", None):
        source = f"--eval-config {args.eval_config}"
        entries, defaults = read_eval_config(args.eval_config)
        args.eval_prompt_data = [str(x) for entry in entries for x in (entry["name"], entry["path"])]
    args.eval_datasets = eval_datasets(args.eval_prompt_data)  # checks the names are unique
    if not entries:
        entries = [{"name": name, "path": path} for name, path in args.eval_datasets]
    args.eval_dataset_configs = build_dataset_configs(args, entries, defaults, source, rm_types)
    given = sorted({name for c in args.eval_dataset_configs for name in NO_EFFECT if getattr(c, name) is not None})
    if given:
        logger.warning("%s: %s accepted without effect (slime's eval does not read them either)", source,
                       ", ".join(given))  # fmt: skip
    check_plugins(args)


def check_plugins(args: Any) -> None:
    """Load each dataset's own custom_rm_path and custom_generate_function_path now, so a bad one fails before
    anything starts (PluginError naming the dataset)."""
    for config in args.eval_dataset_configs:
        for name in ("custom_rm_path", "custom_generate_function_path"):
            path = getattr(config, name)
            if path and path != _flag(args, FALLBACKS.get(name, (name,))):
                load_dataset_plugin(args, config, name)


def load_dataset_plugin(args: Any, config: EvalDatasetConfig, name: str) -> tuple[Any, str]:
    """Load the dataset's own `name` plugin (custom_rm_path or custom_generate_function_path): (hook, contract)."""
    path = getattr(config, name)
    flag = f"--eval-config dataset {config.name!r} {name}"
    api = getattr(args, "plugin_api", "auto")
    from rollout.hooks import GENERATE_FLAG, HOOKS
    from slime_like.core.errors import PluginError
    from slime_like.core.plugin_loader import load_hook

    if name == "custom_rm_path":
        return load_hook(path, flag, api, (2, None), (2, None))
    _, native, slime, _ = HOOKS[GENERATE_FLAG]
    fn, contract = load_hook(path, flag, api, native, slime)
    if args.group_generate and contract == "slime":
        raise PluginError(f"--group-generate: {flag}={path!r} follows slime's contract, one sample at a time")
    return fn, contract


def dataset_configs(args: Any) -> list[EvalDatasetConfig]:
    """The run's eval dataset configs (built from `args.eval_datasets` for arguments made without the parser)."""
    configs = getattr(args, "eval_dataset_configs", None)
    if configs is None:
        entries = [{"name": name, "path": path} for name, path in getattr(args, "eval_datasets", None) or []]
        configs = build_dataset_configs(args, entries, {}, "--eval-prompt-data")
    return configs
