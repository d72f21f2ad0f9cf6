"""The loss and advantage functions of a run's RL step, loaded once, each in our contract.

--custom-loss-function-path and --custom-advantage-function-path follow our contract or slime's (rule:
slime_like/core/plugin_loader.py); slime's, and its TIS function and pg-loss reducer, are wrapped here into
ours by slime_contract.py, so the step (rl_step.py) calls one contract. slime's hooks read the batch's columns
under slime's keys (slime_lists.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from slime_like.core.plugin_loader import load_hook
from slime_like.trainer.algorithms.advantages import AdvantageInputs
from slime_like.trainer.algorithms.loss import LossFn, custom_loss_fn, policy_loss_fn, sft_loss_fn
from slime_like.trainer.algorithms.slime_contract import slime_advantage_hook, slime_loss_fn, slime_pg_hooks

LOSS_FLAG = "--custom-loss-function-path"
ADVANTAGE_FLAG = "--custom-advantage-function-path"
TIS_FLAG = "--custom-tis-function-path"
# (positional parameters, async?) of the loss and advantage hooks under (our contract, slime's): docs/plugins.md
LOSS_SIG = ((4, False), (4, False))
ADV_SIG = ((2, False), (2, False))


@dataclass
class StepHooks:
    """The step's loss function and custom advantage function (None: --advantage-estimator's), in our contract."""

    loss_fn: LossFn
    advantage: Callable[[Any, AdvantageInputs], Any] | None = None
    # The flag of a hook that needs SGLang's log-probs of every sample (None: none does).
    needs_rollout_log_probs: str | None = None
    contracts: dict[str, str] = field(default_factory=dict)  # flag -> "native" | "slime", for the hooks set

    def follows_slime(self, flag: str) -> bool:
        """Whether the hook of `flag` follows slime's contract."""
        return self.contracts.get(flag) == "slime"


def load_step_hooks(args: Any) -> StepHooks:
    """The loss of --loss-type and the custom advantage function, loaded and adapted; PluginError names the flag."""
    api = getattr(args, "plugin_api", "auto")
    contracts: dict[str, str] = {}
    if args.loss_type == "sft_loss":
        loss_fn = sft_loss_fn()
    elif args.loss_type == "custom_loss":
        hook, contracts[LOSS_FLAG] = load_hook(args.custom_loss_function_path, LOSS_FLAG, api, *LOSS_SIG)
        if contracts[LOSS_FLAG] == "slime":
            loss_fn = slime_loss_fn(args, hook)
        else:
            loss_fn = custom_loss_fn(args, hook)
    else:
        loss_fn = policy_loss_fn(args, slime_pg_hooks(args))
    needs = TIS_FLAG if getattr(args, "custom_tis_function_path", None) else None
    advantage = None
    if args.custom_advantage_function_path:
        path = args.custom_advantage_function_path
        advantage, contracts[ADVANTAGE_FLAG] = load_hook(path, ADVANTAGE_FLAG, api, *ADV_SIG)
        if contracts[ADVANTAGE_FLAG] == "slime":
            advantage = slime_advantage_hook(advantage)
    return StepHooks(loss_fn, advantage, needs, contracts)
