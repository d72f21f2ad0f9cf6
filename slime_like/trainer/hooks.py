"""slime's trainer hooks, by dotted path: loaded once at start (an error names the flag), called by each trainer rank.

| flag | called | signature (slime's) |
|---|---|---|
| --custom-megatron-init-path | once, after the parallel groups exist, before the model is built | (args) |
| --custom-megatron-before-log-prob-hook-path | before each log-prob forward: the policy's (store_prefix ""), the KL reference's ("ref_"), the OPD teacher's ("teacher_") | (args, model, store_prefix) |
| --custom-megatron-before-train-step-hook-path | before each optimizer step | (args, rollout_id, step_id, model, optimizer, opt_param_scheduler) |
| --rollout-data-postprocess-path | once per rollout, after log-probs and advantages, before the steps | (args, rollout_id, rollout_data) |

`model` is the list of Megatron model chunks. `rollout_data` is slime's dict of per-sample lists of this rank's
samples (`tokens`, `response_lengths`, `total_lengths`, `loss_masks`, `log_probs`, `advantages`, and when present
`ref_log_probs`, `rollout_log_probs`, `returns`, `values`, `entropy` with --use-rollout-entropy); changes the hook
makes to `loss_masks` and `advantages` train, as in slime.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from buffer.train_data import TrainData
from slime_like.core.plugin_loader import load_plugin

FLAGS = {  # flag -> (args attribute, positional parameters the hook must take)
    "--custom-megatron-init-path": ("custom_megatron_init_path", 1),
    "--custom-megatron-before-log-prob-hook-path": ("custom_megatron_before_log_prob_hook_path", 3),
    "--custom-megatron-before-train-step-hook-path": ("custom_megatron_before_train_step_hook_path", 6),
    "--rollout-data-postprocess-path": ("rollout_data_postprocess_path", 3),
}


def add_trainer_hook_arguments(parser: argparse.ArgumentParser) -> None:
    """The four flags (docs: this module's table)."""
    g = parser.add_argument_group("trainer hooks (slime's; slime_like/trainer/hooks.py)")
    for flag in FLAGS:
        g.add_argument(flag, default=None, help="dotted path; see slime_like/trainer/hooks.py")


@dataclass
class TrainerHooks:
    """The loaded hooks (None where the flag is not set)."""

    init: Callable[..., Any] | None = None
    before_log_prob: Callable[..., Any] | None = None
    before_train_step: Callable[..., Any] | None = None
    rollout_data_postprocess: Callable[..., Any] | None = None

    def postprocess(self, args: Any, rollout_id: int, batch: TrainData) -> TrainData:
        """--rollout-data-postprocess-path on this rank's batch: the batch with the loss masks and advantages the
        hook leaves (they train)."""
        if self.rollout_data_postprocess is None:
            return batch
        # Here: argument parsing imports this module and must not load torch.
        from slime_like.trainer.algorithms.slime_lists import apply_slime_lists, slime_lists

        data = slime_lists(batch)
        self.rollout_data_postprocess(args, rollout_id, data)
        return apply_slime_lists(data, batch, "--rollout-data-postprocess-path")


def load_trainer_hooks(args: Any) -> TrainerHooks:
    """Import every trainer hook flag of `args`; PluginError names the flag and what is wrong."""
    loaded = {}
    for flag, (attr, params) in FLAGS.items():
        path = getattr(args, attr, None)
        loaded[attr] = load_plugin(path, flag, params=params, is_async=False) if path else None
    return TrainerHooks(
        init=loaded["custom_megatron_init_path"],
        before_log_prob=loaded["custom_megatron_before_log_prob_hook_path"],
        before_train_step=loaded["custom_megatron_before_train_step_hook_path"],
        rollout_data_postprocess=loaded["rollout_data_postprocess_path"],
    )
