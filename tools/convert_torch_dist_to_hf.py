"""Convert a Megatron torch_dist checkpoint (the engine's --save, slime's, or convert_hf_to_torch_dist's) to HF.

Example:
  torchrun --nproc_per_node 2 tools/convert_torch_dist_to_hf.py --load run/iter_0000009 \\
      --hf-checkpoint qwen3-4B --save qwen3-4B-step10 --tensor-model-parallel-size 2
--load is a run directory (the checkpoint its latest_checkpointed_iteration.txt names, "release" included),
one iter_XXXXXXX/ or release/ directory, or a plain torch_dist directory. Only the model weights are read.
--hf-checkpoint is the original HF directory: the model is built from its config, and its config,
tokenizer, chat template and generation config are copied next to the new weights, with its multi-token-prediction
layers (GLM-4.5, DeepSeek-V3, MiMo) unless the checkpoint holds them (MiMo's, trained with --enable-mtp-training,
or converted with --mtp-num-layers): those are exported. The layout used
here may differ from the one the checkpoint was saved with (the model weights are resharded). A
checkpoint whose tensor shapes do not match the HF config stops the tool naming each tensor.
A LoRA run's checkpoint (--lora-rank) holds the adapters next to the frozen base; the tool then needs the run's
--lora-alpha (the checkpoint does not record it) and writes the base with the adapter merged in
(W + alpha/rank * B A), plus the adapter alone in PEFT format under <save>/lora_adapter/.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

from slime_like.core.logs import setup_logging


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the tool (no heavy import: --help is instant)."""
    from slime_like.trainer.megatron.checkpoint_conversion import add_mtp_arguments, add_parallel_arguments
    from slime_like.trainer.model_arguments import add_model_arguments

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--load", required=True, help="run directory (tracker), iter_*/release directory or torch_dist dir")
    p.add_argument("--hf-checkpoint", required=True, help="the original HF directory (config and tokenizer)")
    p.add_argument("--save", required=True, help="output HF directory (created)")
    p.add_argument("--max-shard-size-gb", type=float, default=5.0, help="size of each safetensors file")
    add_parallel_arguments(p)
    add_model_arguments(p)
    add_mtp_arguments(p)  # accepted as in slime's model files; the checkpoint says whether it holds MTP layers
    p.add_argument("--lora-alpha", type=float, default=None, help="a LoRA run's --lora-alpha (its checkpoint needs it)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Check the arguments, build the model, load the checkpoint, export HF weights from rank 0."""
    args = parse_args(argv)
    setup_logging("convert_torch_dist_to_hf")
    import torch
    from megatron.core import parallel_state

    from slime_like.core.hf_config import load_hf_config
    from slime_like.trainer.megatron import checkpoint_conversion as conv
    from slime_like.trainer.megatron.checkpoint import load_checkpoint, model_sharded_state_dict
    from slime_like.trainer.megatron.model import export_hf_weights, untrained_hf_weights

    hf_config = load_hf_config(args.hf_checkpoint)
    try:  # as prepare_model does, but before --load is read: argument errors come first
        conv.check_arguments(args, hf_config, int(os.environ.get("WORLD_SIZE", "1")))
    except conv.ConversionError as exc:
        sys.exit(f"convert_torch_dist_to_hf: {exc}")
    args.load = _checkpoint_dir(args.load)
    # MTP layers the checkpoint holds (an --enable-mtp-training run's, or converted with --mtp-num-layers) are
    # built and exported: their trained weights, not the original's.
    mtp_layers = conv.mtp_layers_to_build(hf_config, _stored_mtp_layers(args.load))
    lora = _stored_lora(args.load, args.lora_alpha)
    bridge, model, ours = conv.prepare_model(args, "convert_torch_dist_to_hf", mtp_layers, lora)
    problems = conv.checkpoint_shape_problems(args.load, model_sharded_state_dict(model))
    if problems:
        sys.exit(
            f"convert_torch_dist_to_hf: {args.load} does not hold the model of {args.hf_checkpoint}'s config:\n  "
            + "\n  ".join(problems)
        )
    load_checkpoint(args.load, model, weights_only=True)
    adapter = {}
    if lora is not None:  # a collective (gathers over TP), before the weights' export
        from megatron.core.utils import get_model_config

        from slime_like.trainer.megatron.lora import PEFT_PREFIX, export_adapter

        adapter = dict(export_adapter(model, bridge.hf_config, get_model_config(model[0])))
    weights = export_hf_weights(bridge, model)
    if torch.distributed.get_rank() != 0:
        for _ in weights:  # the gather over TP/PP/EP ranks is collective
            pass
    else:
        # Tensors Megatron does not hold (multi-token-prediction layers) are copied from --hf-checkpoint unchanged.
        weights = itertools.chain(weights, untrained_hf_weights(bridge))
        if lora is not None:
            from slime_like.trainer.megatron.lora import merge_adapter, write_adapter

            merged = {k.removeprefix(PEFT_PREFIX): v for k, v in adapter.items()}
            weights = merge_adapter(weights, merged, lora.scale, args.load)
            write_adapter(os.path.join(args.save, "lora_adapter"), adapter, lora, args.hf_checkpoint)
        files = conv.write_safetensors(weights, args.save, int(args.max_shard_size_gb * 1024**3))
        conv.copy_model_files(args.hf_checkpoint, args.save)
        conv.set_config_dtype(args.save, bridge.dtype)
        print(f"wrote {len(files)} safetensors file(s) to {args.save}")
    torch.distributed.barrier()
    if ours:
        parallel_state.destroy_model_parallel()  # the process group stays: callers may convert again


def _stored_mtp_layers(directory: str) -> int:
    """How many MTP layers (mtp.layers.{i}.*) a torch_dist checkpoint holds."""
    import re

    from megatron.core.dist_checkpointing import load_tensors_metadata

    found = {m.group(1) for key in load_tensors_metadata(directory) if (m := re.match(r"mtp\.layers\.(\d+)\.", key))}
    return len(found)


def _stored_lora(directory: str, alpha: float | None):
    """The LoraSettings of the adapters a torch_dist checkpoint holds (None without any); exits naming
    --lora-alpha when they are there and it is not given."""
    import re

    from megatron.core.dist_checkpointing import load_tensors_metadata

    from slime_like.trainer.megatron.lora import LoraSettings
    from slime_like.trainer.megatron.lora_flags import TARGET_PATHS

    pattern = re.compile(r"decoder\.layers\.(?:\d+\.)?(?:self_attention|mlp)\.(linear_\w+)\.lora\.A$")
    found = {m.group(1): meta for key, meta in load_tensors_metadata(directory).items() if (m := pattern.search(key))}
    if not found:
        return None
    rank = int(next(iter(found.values())).global_shape[-2])  # A is [rank, in] (a layer axis may come first)
    targets = tuple(t for t in TARGET_PATHS if t in found)
    if alpha is None:
        sys.exit(
            f"convert_torch_dist_to_hf: {directory} holds LoRA adapters (rank {rank} on {','.join(targets)}) next to "
            "the frozen base: pass the run's --lora-alpha (e.g. --lora-alpha 32) to write the base with the adapter "
            "merged in (and the adapter in PEFT format under <save>/lora_adapter/)"
        )
    return LoraSettings(rank, alpha, targets=targets)


def _checkpoint_dir(load: str) -> str:
    """The torch_dist directory --load names (exit naming the problem when there is none or it is incomplete)."""
    from slime_like.trainer.megatron.checkpoint_layout import CheckpointError, find_checkpoint

    try:
        checkpoint = find_checkpoint(load, "--load")
    except (CheckpointError, OSError) as exc:
        sys.exit(f"convert_torch_dist_to_hf: {exc}")
    if checkpoint is not None:
        if checkpoint.note:
            print(checkpoint.note, file=sys.stderr)
        return str(checkpoint.directory)
    if not os.path.isfile(os.path.join(load, "metadata.json")):
        sys.exit(
            f"convert_torch_dist_to_hf: --load {load}: no torch_dist checkpoint there (no "
            "latest_checkpointed_iteration.txt, no metadata.json): give a run directory, an iter_XXXXXXX/ or "
            "release/ directory"
        )
    return load


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script
    main()
    from slime_like.trainer.megatron.parallel import destroy_parallel

    destroy_parallel()
