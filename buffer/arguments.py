"""Flags of the data buffer."""

from __future__ import annotations

import argparse


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """Prompt data, grouping and batch-size flags."""
    g = parser.add_argument_group("data")
    g.add_argument("--prompt-data", default=None, help="jsonl or parquet file of prompts (or --data-source-path)")
    g.add_argument("--input-key", default="prompt", help="row key of the prompt (a string or chat messages)")
    g.add_argument("--label-key", default="label", help="row key of the label given to the reward function")
    g.add_argument("--metadata-key", default="metadata", help="row key of per-row metadata (optional in rows)")
    g.add_argument("--apply-chat-template", action="store_true", help="wrap prompts in the tokenizer's chat template")
    g.add_argument("--rollout-shuffle", action="store_true", help="shuffle prompts, a new order each epoch")
    g.add_argument("--rollout-seed", type=int, default=42)
    g.add_argument("--rollout-max-prompt-len", type=int, default=None, help="skip (and count) longer prompts")
    g.add_argument("--skip-bad-rows", action="store_true", help="skip and count unreadable rows instead of failing")
    g.add_argument("--rollout-batch-size", type=int, required=True, help="prompts per rollout")
    g.add_argument("--n-samples-per-prompt", type=int, default=1, help="samples per prompt (the GRPO group size)")
    g.add_argument(
        "--data-source-path",
        default=None,
        help="(args, tokenizer) -> data source with get_groups/state_dict/load_state_dict (default: --prompt-data)",
    )
