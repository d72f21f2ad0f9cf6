"""Convert a Hugging Face checkpoint into a Megatron distributed (torch_dist) checkpoint of the model.

Example (any TP/PP/EP; the process count is torchrun's):
  torchrun --nproc_per_node 2 tools/convert_hf_to_torch_dist.py --hf-checkpoint qwen3-4B --save qwen3-4B_torch_dist \\
      --tensor-model-parallel-size 2 $(cat-your-model-args)   # e.g. the MODEL_ARGS of scripts/models/qwen3-4B.sh
A single process needs no torchrun. Megatron architecture flags (--num-layers, --hidden-size, ...) are
optional; each one given is checked against the HF config, and a mismatch stops the tool naming the
flag and the config field. The result is model-only and loads at any parallel layout. It is written in
Megatron-LM's release layout, as slime's converter writes it: <save>/release/ (torch_dist) and
<save>/latest_checkpointed_iteration.txt holding "release", for --ref-load, --load and
tools/convert_torch_dist_to_hf.py. The directory appears whole or not at all (written aside, then renamed).
"""

from __future__ import annotations

import argparse
import os
import sys

from slime_like.core.logs import setup_logging


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the tool (no heavy import: --help is instant)."""
    from slime_like.trainer.megatron.checkpoint_conversion import add_mtp_arguments, add_parallel_arguments
    from slime_like.trainer.model_arguments import add_model_arguments

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hf-checkpoint", required=True, help="HF model directory (config.json and safetensors)")
    p.add_argument("--save", required=True, help="output directory: release/ and the tracker file are written there")
    add_parallel_arguments(p)
    add_model_arguments(p)
    add_mtp_arguments(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Check the arguments, build the model at the requested layout, load the HF weights, save."""
    args = parse_args(argv)
    setup_logging("convert_hf_to_torch_dist")
    _check_save_dir(args.save)
    import torch
    from megatron.core import parallel_state

    from slime_like.core.hf_config import load_hf_config
    from slime_like.trainer.megatron import checkpoint_layout as layout
    from slime_like.trainer.megatron.checkpoint import save_checkpoint
    from slime_like.trainer.megatron.checkpoint_conversion import mtp_layers_to_build, prepare_model
    from slime_like.trainer.megatron.model import load_hf_weights

    mtp_layers = mtp_layers_to_build(load_hf_config(args.hf_checkpoint), args.mtp_num_layers)
    bridge, model, ours = prepare_model(args, "convert_hf_to_torch_dist", mtp_layers)
    load_hf_weights(bridge, model, args.hf_checkpoint)
    rank0 = torch.distributed.get_rank() == 0
    if rank0:
        layout.begin_save(args.save, None)
    torch.distributed.barrier()
    tmp = layout.temporary_dir(args.save, None)
    save_checkpoint(tmp, model, rng=False)  # every rank writes its shards; ends with a barrier
    if rank0:
        print(f"wrote {layout.commit_save(args.save, None, tmp)}")
    torch.distributed.barrier()
    if ours:
        parallel_state.destroy_model_parallel()  # the process group stays: callers may convert again


def _check_save_dir(save: str) -> None:
    """Exit naming the problem when --save holds a training run (its tracker names an iteration)."""
    from slime_like.trainer.megatron.checkpoint_layout import TRACKER, CheckpointError, read_tracker

    if not os.path.isfile(os.path.join(save, TRACKER)):
        return
    try:
        iteration = read_tracker(save)
    except CheckpointError as exc:
        sys.exit(f"convert_hf_to_torch_dist: --save {save}: {exc}")
    if iteration is not None:
        sys.exit(
            f"convert_hf_to_torch_dist: --save {save} holds a training run (its {TRACKER} names iteration "
            f"{iteration}); writing release/ there would hide it: choose another --save directory"
        )


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script
    main()
    from slime_like.trainer.megatron.parallel import destroy_parallel

    destroy_parallel()
