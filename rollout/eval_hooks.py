"""Each eval dataset's generate and reward functions: its own custom_generate_function_path, custom_rm_path or
rm_type (slime's eval dataset fields), else the run's.

The reward is chosen as slime's rm_hub chooses it for an eval sample: the dataset's custom_rm_path, else
--custom-rm-path, else the dataset's rm_type, else --rm-type. A dataset that ends up with the run's functions
shares the run's hooks; the others get hooks of their own, made once and closed with the rollout manager.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from rollout.eval_config import EvalDatasetConfig, load_dataset_plugin
from rollout.foreign_clients import authorize_foreign_clients
from rollout.hooks import GENERATE_FLAG, HOOKS, RolloutHooks
from rollout.rewards import RewardFunction, get_reward_function


def reward_choice(args: Any, config: EvalDatasetConfig) -> tuple[str | None, str]:
    """(custom reward path or None, rm_type) that score the dataset, in slime's order of precedence."""
    custom = config.custom_rm_path or args.custom_rm_path
    return custom, (config.rm_type or args.rm_type)


def _reward(args: Any, config: EvalDatasetConfig) -> RewardFunction | None:
    """The dataset's own reward function, or None when it is the run's."""
    custom, rm_type = reward_choice(args, config)
    if custom == args.custom_rm_path and (custom or rm_type == args.rm_type):
        return None
    own = copy.copy(args)
    own.custom_rm_path, own.rm_type = custom, rm_type
    return get_reward_function(own)


def dataset_hooks(args: Any, base: RolloutHooks, config: EvalDatasetConfig) -> RolloutHooks | None:
    """Hooks for the dataset when its generate or reward function is not the run's; None when both are."""
    reward = _reward(args, config)
    path = config.custom_generate_function_path
    own_generate = bool(path) and path != args.custom_generate_function_path
    if reward is None and not own_generate:
        return None
    changes: dict[str, Any] = {"reward": reward or base.reward}
    if own_generate:
        fn, contract = load_dataset_plugin(args, config, "custom_generate_function_path")
        adapt = HOOKS[GENERATE_FLAG][3]
        changes["generate"] = adapt(fn) if contract == "slime" and adapt is not None else fn
        changes["contracts"] = {**base.contracts, GENERATE_FLAG: contract}
        authorize_foreign_clients()
    return dataclasses.replace(base, **changes)


def all_dataset_hooks(args: Any, base: RolloutHooks, configs: list[EvalDatasetConfig]) -> dict[str, RolloutHooks]:
    """Dataset name -> its own hooks, for the datasets that need them."""
    out = {}
    for config in configs:
        hooks = dataset_hooks(args, base, config)
        if hooks is not None:
            out[config.name] = hooks
    return out


async def close_dataset_hooks(base: RolloutHooks, hooks: dict[str, RolloutHooks]) -> None:
    """Close the reward functions the datasets' hooks own (not the run's, which they may share)."""
    for own in hooks.values():
        if own.reward is not base.reward:
            await own.reward.close()
