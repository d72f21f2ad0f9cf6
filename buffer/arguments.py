"""Flags of the data buffer."""

from __future__ import annotations

import argparse
from typing import Any

from buffer.multimodal import parse_multimodal_keys


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """Prompt data, grouping and batch-size flags."""
    g = parser.add_argument_group("data")
    g.add_argument("--prompt-data", default=None, help="jsonl or parquet file of prompts (or --data-source-path)")
    g.add_argument(
        "--input-key",
        default="input",
        help="row key of the prompt, a string or chat messages (default: input, as slime)",
    )
    g.add_argument(
        "--label-key",
        default=None,
        help="row key of the label given to the reward function (default: none, the label is None, as slime)",
    )
    g.add_argument("--metadata-key", default="metadata", help="row key of per-row metadata (optional in rows)")
    g.add_argument(
        "--tool-key",
        default=None,
        help="row key of the tools (a list, or JSON of one): in sample.metadata['tools'] and the chat template's",
    )
    g.add_argument(
        "--multimodal-keys",
        type=parse_multimodal_keys,
        default=None,
        help='slime\'s: JSON mapping a media type to the row key of its data, e.g. \'{"image": "images"}\'; each '
        "<image> in the prompt becomes that row's next image (parquet image structs, bytes, paths, data: or http "
        "URLs), rendered by the checkpoint's processor (buffer/multimodal.py)",
    )
    g.add_argument("--apply-chat-template", action="store_true", help="wrap prompts in the tokenizer's chat template")
    g.add_argument("--rollout-shuffle", action="store_true", help="shuffle prompts, a new order each epoch")
    g.add_argument("--rollout-seed", type=int, default=42)
    g.add_argument("--rollout-max-prompt-len", type=int, default=None, help="skip (and count) longer prompts")
    g.add_argument("--skip-bad-rows", action="store_true", help="skip and count unreadable rows instead of failing")
    g.add_argument("--rollout-batch-size", type=int, required=True, help="prompts per rollout")
    g.add_argument(
        "--num-epoch",
        type=int,
        default=None,
        help="without --num-rollout: num_rollout = usable prompts of --prompt-data // --rollout-batch-size x N, as slime",
    )
    g.add_argument("--n-samples-per-prompt", type=int, default=1, help="samples per prompt (the GRPO group size)")
    g.add_argument(
        "--disable-rollout-global-dataset",
        action="store_false",
        dest="rollout_global_dataset",
        help="slime's: the run has no prompt dataset (--prompt-data is not read); the rollout function named by "
        "--rollout-function-path gets groups of empty Samples to fill with data of its own",
    )
    g.add_argument(
        "--data-source-path",
        default=None,
        help="(args, tokenizer) -> data source with get_groups/state_dict/load_state_dict (default: --prompt-data)",
    )


def resolve_num_rollout(args: argparse.Namespace) -> None:
    """Fill --num-rollout from --num-epoch as slime does (whole rollouts per epoch x epochs); ValueError naming the
    flags when neither is given or the epoch cannot be measured."""
    if args.num_rollout is not None:
        return  # given both, slime ignores --num-epoch
    if args.num_epoch is None:
        raise ValueError("set --num-rollout N (rollouts to run) or --num-epoch N (passes over --prompt-data)")
    if not getattr(args, "rollout_global_dataset", True):
        raise ValueError(
            "--num-epoch counts the prompts of --prompt-data, which --disable-rollout-global-dataset leaves unread: "
            "set --num-rollout (as slime)"
        )
    if args.num_epoch < 1:
        raise ValueError(f"--num-epoch {args.num_epoch} must be at least 1")
    if not args.prompt_data or args.data_source_path:
        raise ValueError("--num-epoch counts the prompts of --prompt-data; with --data-source-path set --num-rollout")
    size = dataset_size(args)
    per_epoch = size // args.rollout_batch_size
    if per_epoch < 1:
        raise ValueError(
            f"--num-epoch: --prompt-data has {size} usable prompts, fewer than one --rollout-batch-size "
            f"{args.rollout_batch_size}: set --num-rollout"
        )
    args.num_rollout = per_epoch * args.num_epoch


def dataset_size(args: argparse.Namespace) -> int:
    """Usable prompts of --prompt-data as the run will read them (the tokenizer only when prompts are filtered by
    --rollout-max-prompt-len, which needs their token counts)."""
    from buffer.data_source import PromptDataset

    tokenizer = None
    if args.rollout_max_prompt_len is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.hf_checkpoint)
    dataset = PromptDataset(
        args.prompt_data,
        input_key=args.input_key,
        label_key=args.label_key,
        metadata_key=args.metadata_key,
        tokenizer=tokenizer,
        apply_chat_template=args.apply_chat_template and tokenizer is not None,
        max_prompt_len=args.rollout_max_prompt_len,
        skip_bad_rows=args.skip_bad_rows,
        **multimodal_dataset_kwargs(args),
    )
    return len(dataset)


def multimodal_dataset_kwargs(args: Any, keys: dict[str, str] | None = None) -> dict[str, Any]:
    """PromptDataset's image arguments of a --multimodal-keys run (the keys, or `keys` such as an eval dataset's
    own, and the checkpoint's processor); {} for a text run."""
    keys = keys or getattr(args, "multimodal_keys", None)
    if not keys:
        return {}
    from buffer.multimodal import load_processor

    return {"multimodal_keys": parse_multimodal_keys(keys), "processor": load_processor(args.hf_checkpoint)}
