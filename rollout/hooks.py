"""Every rollout plugin named on the command line, loaded and checked once (before any server starts).

Each hook follows our contract or slime's (rule: slime_like.core.plugin_loader); both are wrapped here, once,
into the one contract the rollout calls (RolloutHooks' derived fields), slime's by rollout/slime_contract.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rollout import postprocess, slime_contract
from rollout.context import RolloutContext
from rollout.filters import fifo_buffer_filter
from rollout.foreign_clients import authorize_foreign_clients
from rollout.generate import generate
from rollout.log_hooks import EVAL_LOG_FLAG, ROLLOUT_LOG_FLAG
from rollout.rewards import RewardFunction, get_reward_function
from rollout.sample_hooks import SampleHook, load_sample_hooks
from rollout.slime_train_data import FLAG as CONVERT_FLAG
from rollout.slime_train_data import convert_hook
from slime_like.core.errors import PluginError
from slime_like.core.plugin_loader import Signature, load_hook
from slime_like.core.sample import Sample

GENERATE_FLAG = "--custom-generate-function-path"
SAMPLE_FILTER_FLAG = "--rollout-sample-filter-path"
ALL_SAMPLES_FLAG = "--rollout-all-samples-process-path"
REWARD_POST_PROCESS_FLAG = "--custom-reward-post-process-path"

# flag -> (args attribute, our signature, slime's signature, slime adapter or None when RolloutHooks adapts).
HOOKS: dict[str, tuple[str, Signature, Signature, Callable[[Any], Any] | None]] = {
    GENERATE_FLAG: ("custom_generate_function_path", (3, True), (3, True), slime_contract.generate_hook),
    "--buffer-filter-path": ("buffer_filter_path", (3, False), (4, False), slime_contract.buffer_filter_hook),
    "--dynamic-sampling-filter-path": (
        "dynamic_sampling_filter_path",
        (2, False),
        (2, False),
        slime_contract.dynamic_filter_hook,
    ),
    SAMPLE_FILTER_FLAG: ("rollout_sample_filter_path", (2, False), (2, False), None),
    ALL_SAMPLES_FLAG: ("rollout_all_samples_process_path", (3, False), (3, False), None),
    CONVERT_FLAG: ("custom_convert_samples_to_train_data_path", (2, False), (2, False), None),  # slime's only
    REWARD_POST_PROCESS_FLAG: ("custom_reward_post_process_path", (2, False), (2, False), None),
    "--rollout-function-path": ("rollout_function_path", (3, True), (3, False), slime_contract.rollout_function_hook),
    "--eval-function-path": ("eval_function_path", (3, True), (3, False), slime_contract.eval_function_hook),
    # slime's log functions (rollout/log_hooks.py): one contract, slime's, plain functions.
    ROLLOUT_LOG_FLAG: ("custom_rollout_log_function_path", (5, False), (5, False), None),
    EVAL_LOG_FLAG: ("custom_eval_rollout_log_function_path", (4, False), (4, False), None),
    # A class qualifies: its signature is that of __init__ without self (slime's takes args only).
    "--data-source-path": ("data_source_path", (2, None), (1, None), slime_contract.data_source_hook),
}
# The post-rollout hooks as the rollout calls them, `(ctx, groups, fn) -> None`, by contract: (ours, slime's).
APPLY: dict[str, tuple[Callable[..., None], Callable[..., None]]] = {
    SAMPLE_FILTER_FLAG: (postprocess.apply_sample_filter, slime_contract.apply_sample_filter),
    ALL_SAMPLES_FLAG: (slime_contract.apply_all_samples_process, slime_contract.apply_all_samples_process),
    REWARD_POST_PROCESS_FLAG: (postprocess.apply_reward_post_process, slime_contract.apply_reward_post_process),
}
GroupsHook = Callable[[RolloutContext, list[list[Sample]]], None]


def returns_sample(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[list[Sample]]]:
    """Our generate contract, `async (ctx, sample, params) -> that Sample, updated` (or a list whose first is that
    Sample, then samples of the same run: an agent's branches, plugins/openai_agent.py), as the rollout calls it:
    `-> [sample, ...]` (slime's may fan one sample out into several: rollout/slime_contract.generate_hook)."""

    async def generate_sample(ctx: RolloutContext, sample: Sample, params: dict[str, Any]) -> list[Sample]:
        out = await fn(ctx, sample, params)
        samples = out if isinstance(out, list) else [out]
        if not samples or samples[0] is not sample or not all(isinstance(s, Sample) for s in samples):
            raise TypeError(
                f"{GENERATE_FLAG} must return the Sample it was given, updated (or a list of Samples starting with it)"
            )
        return samples

    generate_sample.__name__ = getattr(fn, "__name__", "generate")
    return generate_sample


@dataclass
class RolloutHooks:
    """The functions a rollout calls; each is a plugin when its flag is set, else the built-in (or None)."""

    generate: Callable[..., Awaitable[Any]]
    group_generate: bool
    reward: RewardFunction
    buffer_filter: Callable[[Any, list[list[Sample]], int], list[list[Sample]]]
    dynamic_filter: Callable[[Any, list[Sample]], Any] | None = None
    sample_filter: Callable[[Any, list[Sample]], list[bool]] | None = None
    all_samples_process: Callable[[Any, list[list[Sample]], Any], None] | None = None  # slime's, built-in loop only
    convert_samples: Callable[[Any, list[list[Sample]]], Any] | None = None  # slime's, -> TrainData
    reward_post_process: Callable[[Any, list[Sample]], list[float]] | None = None
    rollout_function: Callable[..., Awaitable[list[list[Sample]]]] | None = None
    eval_function: Callable[..., Awaitable[dict[str, Any]]] | None = None
    data_source_factory: Callable[[Any, Any], Any] | None = None
    sample_hooks: list[SampleHook] = field(default_factory=list)  # --rollout-sample-hook-path, in order
    rollout_log: Callable[..., bool] | None = None  # --custom-rollout-log-function-path
    eval_log: Callable[..., bool] | None = None  # --custom-eval-rollout-log-function-path
    contracts: dict[str, str] = field(default_factory=dict)  # flag -> "native" | "slime", for the flags set
    # The one contract the rollout calls, made from the hooks above by their contracts (__post_init__):
    generate_sample: Callable[..., Awaitable[list[Sample]]] = field(init=False)  # (ctx, sample, params)
    keeps_generated_rewards: bool = field(init=False)  # rewards the generate function set are kept (slime's)
    filter_samples: GroupsHook | None = field(init=False)
    process_all_samples: GroupsHook | None = field(init=False)
    post_process_rewards: GroupsHook | None = field(init=False)

    def __post_init__(self) -> None:
        slime_generate = self.follows_slime(GENERATE_FLAG)  # adapted by the loader: it returns a list already
        self.generate_sample = (
            self.generate if slime_generate or self.generate is None else returns_sample(self.generate)
        )
        self.keeps_generated_rewards = slime_generate
        self.filter_samples = self._groups_hook(SAMPLE_FILTER_FLAG, self.sample_filter)
        self.process_all_samples = self._groups_hook(ALL_SAMPLES_FLAG, self.all_samples_process)
        self.post_process_rewards = self._groups_hook(REWARD_POST_PROCESS_FLAG, self.reward_post_process)

    def _groups_hook(self, flag: str, fn: Callable[..., Any] | None) -> GroupsHook | None:
        """`fn`, loaded for `flag`, as `(ctx, groups) -> None` (APPLY of its contract)."""
        if fn is None:
            return None
        apply = APPLY[flag][self.follows_slime(flag)]
        return lambda ctx, groups: apply(ctx, groups, fn)

    def follows_slime(self, flag: str) -> bool:
        """Whether the hook of `flag` follows slime's contract."""
        return self.contracts.get(flag) == "slime"

    async def close(self) -> None:
        """Release what the reward function holds (HTTP session, worker processes)."""
        await self.reward.close()


def load_hooks(args: Any) -> RolloutHooks:
    """Load every plugin flag of `args`; a bad path or signature raises PluginError naming the flag."""
    api = getattr(args, "plugin_api", "auto")
    loaded: dict[str, Any] = {}
    contracts: dict[str, str] = {}
    for flag, (attr, native, slime, adapt) in HOOKS.items():
        path = getattr(args, attr)
        if not path:
            continue
        fn, contracts[flag] = load_hook(path, flag, api, native, slime)
        loaded[flag] = adapt(fn) if contracts[flag] == "slime" and adapt is not None else fn
    authorize_foreign_clients()  # e.g. strands-sglang's client, imported by a plugin, sends the run's secret
    if args.group_generate and contracts.get(GENERATE_FLAG) == "slime":
        path = args.custom_generate_function_path
        raise PluginError(
            f"--group-generate: {GENERATE_FLAG}={path!r} follows slime's contract, one sample at a time (--plugin-api)"
        )
    if args.rollout_function_path and args.rollout_all_samples_process_path:
        raise PluginError(
            f"{ALL_SAMPLES_FLAG} is called by the built-in rollout only (as in slime), not with --rollout-function-path: "
            "call it from your rollout function, or drop one of the two flags"
        )
    return RolloutHooks(
        generate=loaded.get(GENERATE_FLAG) or generate,
        group_generate=bool(args.group_generate),
        reward=get_reward_function(args),
        buffer_filter=loaded.get("--buffer-filter-path") or fifo_buffer_filter,
        dynamic_filter=loaded.get("--dynamic-sampling-filter-path"),
        sample_filter=loaded.get(SAMPLE_FILTER_FLAG),
        all_samples_process=loaded.get(ALL_SAMPLES_FLAG),
        convert_samples=convert_hook(loaded[CONVERT_FLAG]) if CONVERT_FLAG in loaded else None,
        reward_post_process=loaded.get(REWARD_POST_PROCESS_FLAG),
        rollout_function=loaded.get("--rollout-function-path"),
        eval_function=loaded.get("--eval-function-path"),
        data_source_factory=loaded.get("--data-source-path") or _no_dataset(args),
        sample_hooks=load_sample_hooks(getattr(args, "rollout_sample_hook_path", None)),
        rollout_log=loaded.get(ROLLOUT_LOG_FLAG),
        eval_log=loaded.get(EVAL_LOG_FLAG),
        contracts=contracts,
    )


def _no_dataset(args: Any) -> Callable[[Any, Any], Any] | None:
    """--disable-rollout-global-dataset: the factory of the source of empty samples (None: the prompt dataset)."""
    if getattr(args, "rollout_global_dataset", True):
        return None
    from buffer.data_source import empty_source

    return empty_source
