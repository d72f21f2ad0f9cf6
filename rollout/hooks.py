"""Every rollout plugin named on the command line, loaded and checked once (before any server starts)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from rollout.filters import fifo_buffer_filter
from rollout.generate import generate
from rollout.rewards import RewardFunction, get_reward_function
from slime_like.core.plugin_loader import load_plugin
from slime_like.core.sample import Sample


@dataclass
class RolloutHooks:
    """The functions a rollout calls; each is a plugin when its flag is set, else the built-in (or None)."""

    generate: Callable[..., Awaitable[Any]]
    group_generate: bool
    reward: RewardFunction
    buffer_filter: Callable[[Any, list[list[Sample]], int], list[list[Sample]]]
    dynamic_filter: Callable[[Any, list[Sample]], Any] | None = None
    sample_filter: Callable[[Any, list[Sample]], list[bool]] | None = None
    reward_post_process: Callable[[Any, list[Sample]], list[float]] | None = None
    rollout_function: Callable[..., Awaitable[list[list[Sample]]]] | None = None
    eval_function: Callable[..., Awaitable[dict[str, Any]]] | None = None
    data_source_factory: Callable[[Any, Any], Any] | None = None

    async def close(self) -> None:
        """Release what the reward function holds (HTTP session, worker processes)."""
        await self.reward.close()


def _optional(path: str | None, flag: str, params: int, is_async: bool | None = False) -> Any:
    return load_plugin(path, flag, params=params, is_async=is_async) if path else None


def load_hooks(args: Any) -> RolloutHooks:
    """Load every plugin flag of `args`; a bad path or signature raises PluginError naming the flag."""
    gen_flag = "--custom-generate-function-path"
    return RolloutHooks(
        generate=_optional(args.custom_generate_function_path, gen_flag, 3, is_async=True) or generate,
        group_generate=bool(args.group_generate),
        reward=get_reward_function(args),
        buffer_filter=_optional(args.buffer_filter_path, "--buffer-filter-path", 3) or fifo_buffer_filter,
        dynamic_filter=_optional(args.dynamic_sampling_filter_path, "--dynamic-sampling-filter-path", 2),
        sample_filter=_optional(args.rollout_sample_filter_path, "--rollout-sample-filter-path", 2),
        reward_post_process=_optional(args.custom_reward_post_process_path, "--custom-reward-post-process-path", 2),
        rollout_function=_optional(args.rollout_function_path, "--rollout-function-path", 3, is_async=True),
        eval_function=_optional(args.eval_function_path, "--eval-function-path", 3, is_async=True),
        # A class qualifies: its signature is that of __init__ without self.
        data_source_factory=_optional(args.data_source_path, "--data-source-path", 2, is_async=None),
    )
