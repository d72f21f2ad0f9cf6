"""slime's debug flags: dump each rollout's samples, replay dumped rollouts into training, run one side alone.

A dump is slime's file: `torch.save({"rollout_id": id, "samples": [sample.to_dict(), ...]})` at the path
template with `{rollout_id}` filled in (`eval_<id>` for evaluations), so dumps move between slime and here.
`--save-debug-rollout-data` without a path keeps this project's readable form, one jsonl per rollout under
`<output-dir>/rollouts/`; those replay too (`--load-debug-rollout-data <dir>/rollout_{rollout_id:06d}.jsonl`).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from slime_like.core.errors import ArgumentError
from slime_like.core.sample import Sample, sample_type

logger = logging.getLogger(__name__)

# --save-debug-rollout-data given without a path: the jsonl files under output-dir/rollouts/.
IN_OUTPUT_DIR = ""


def add_debug_arguments(parser: argparse.ArgumentParser) -> None:
    """slime's debug group: rollout dumps, replay into training, rollout-only and train-only runs."""
    g = parser.add_argument_group("debug and replay (slime's flags)")
    g.add_argument(
        "--save-debug-rollout-data",
        nargs="?",
        const=IN_OUTPUT_DIR,
        default=None,
        metavar="PATH",
        help="save every rollout's samples: PATH is slime's template with {rollout_id} (a torch file slime reads "
        "too); without PATH, one jsonl per rollout under output-dir/rollouts/",
    )
    g.add_argument(
        "--load-debug-rollout-data",
        default=None,
        metavar="PATH",
        help="train on the rollouts saved at this {rollout_id} template instead of generating: no SGLang server "
        "starts (implies --debug-train-only, as slime)",
    )
    g.add_argument(
        "--load-debug-rollout-data-subsample",
        type=float,
        default=None,
        help="keep this fraction of each loaded rollout (its first and last samples, as slime)",
    )
    g.add_argument(
        "--debug-rollout-only", action="store_true", help="generate rollouts only: no trainer, no weight updates"
    )
    g.add_argument(
        "--debug-train-only", action="store_true", help="train only, on --load-debug-rollout-data: no servers"
    )
    g.add_argument(
        "--save-debug-train-data",
        default=None,
        metavar="PATH",
        help="save each step's training data (the rollout as the trainer receives it) at this template with "
        "{rollout_id} (and slime's {rank}, the one writer's: 0)",
    )
    g.add_argument(
        "--dump-details",
        default=None,
        metavar="DIR",
        help="slime's shorthand: --save-debug-rollout-data DIR/rollout_data/{rollout_id}.pt and "
        "--save-debug-train-data DIR/train_data/{rollout_id}.pt",
    )


def validate_debug_args(args: Any) -> None:
    """slime's rules: loading dumps means train-only; the two -only modes exclude each other."""
    if getattr(args, "dump_details", None) is not None:  # as slime's argument check sets them
        args.save_debug_rollout_data = f"{args.dump_details}/rollout_data/{{rollout_id}}.pt"
        args.save_debug_train_data = f"{args.dump_details}/train_data/{{rollout_id}}.pt"
    if args.load_debug_rollout_data is not None:
        if "{rollout_id}" not in args.load_debug_rollout_data:
            logger.info("--load-debug-rollout-data has no {rollout_id}: every rollout replays the same file")
        args.debug_train_only = True  # slime: no servers are started when rollouts come from files
    ratio = args.load_debug_rollout_data_subsample
    if ratio is not None and not 0 < ratio <= 1:
        raise ArgumentError(f"--load-debug-rollout-data-subsample {ratio}: give a fraction in (0, 1]")
    if args.debug_rollout_only and args.debug_train_only:
        raise ArgumentError("--debug-rollout-only and --debug-train-only exclude each other: give one")
    if (
        args.debug_train_only
        and args.load_debug_rollout_data is None
        and not getattr(args, "rollout_function_path", None)
    ):
        raise ArgumentError(
            "--debug-train-only starts no SGLang server, so rollouts must come from files: add "
            "--load-debug-rollout-data PATH (saved earlier with --save-debug-rollout-data PATH), or a "
            "--rollout-function-path that needs no server (slime's SFT: slime.rollout.sft_rollout.generate_rollout)"
        )
    if args.save_debug_train_data and args.save_debug_train_data == args.save_debug_rollout_data:
        raise ArgumentError("--save-debug-train-data must differ from --save-debug-rollout-data (one would overwrite)")
    if args.debug_train_only and getattr(args, "fully_async", False):
        raise ArgumentError("--fully-async generates continuously: it cannot replay saved rollouts")


def dump_path(template: str, rollout_id: int, evaluation: bool = False, **fields: Any) -> Path:
    """The file of one rollout (or evaluation: `eval_<id>`, as slime names it) under a {rollout_id} template."""
    return Path(template.format(rollout_id=f"eval_{rollout_id}" if evaluation else rollout_id, **fields))


def save_rollout_data(args: Any, rollout_id: int, groups: list[list[Sample]], evaluation: bool = False) -> Path | None:
    """With --save-debug-rollout-data, write this rollout's samples (slime's torch file, or our jsonl)."""
    template = args.save_debug_rollout_data
    if template is None:
        return None
    samples = [s.to_dict() for group in groups for s in group]
    if template == IN_OUTPUT_DIR:
        path = Path(args.output_dir) / "rollouts" / f"{'eval' if evaluation else 'rollout'}_{rollout_id:06d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as f:
            f.writelines(json.dumps(s) + "\n" for s in samples)
        return path
    import torch

    path = dump_path(template, rollout_id, evaluation)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"rollout_id": rollout_id, "samples": samples}, path)
    return path


def load_rollout_data(template: str, rollout_id: int, subsample: float | None = None) -> list[list[Sample]]:
    """The samples saved for `rollout_id`, regrouped by group_index in file order (slime's subsample kept)."""
    import torch

    path = dump_path(template, rollout_id)
    if not path.is_file():
        raise FileNotFoundError(
            f"--load-debug-rollout-data: no saved rollout {rollout_id} at {path} (save runs with "
            "--save-debug-rollout-data PATH; --num-rollout must not go past the rollouts saved)"
        )
    if path.suffix == ".jsonl":  # ours: e.g. output-dir/rollouts/rollout_{rollout_id:06d}.jsonl
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    else:  # slime's dumps are pickled dicts of plain values; the file is the user's own, as in slime
        rows = torch.load(path, weights_only=False)["samples"]
    samples = [sample_type().from_dict(row) for row in rows]
    if subsample is not None:
        keep = max(1, int(len(samples) * subsample))
        samples = samples[: keep // 2] + samples[-keep // 2 :]  # slime's split (the odd one from the end)
    groups: dict[Any, list[Sample]] = {}
    for i, sample in enumerate(samples):
        groups.setdefault(sample.group_index if sample.group_index is not None else f"sample {i}", []).append(sample)
    return list(groups.values())


def save_train_data(template: str, rollout_id: int, data: Any) -> Path:
    """--save-debug-train-data: one step's training data (TrainData's columns, one entry per sample)."""
    import torch

    path = dump_path(template, rollout_id, rank=0)  # slime's {rank}: the one writer, here the driver
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"rollout_id": rollout_id, **vars(data)}, path)
    return path
