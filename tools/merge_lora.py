"""Merge a Hugging Face PEFT LoRA adapter into its HF base model, writing a full HF checkpoint.

Example:
  python tools/merge_lora.py --hf-checkpoint Qwen3-4B --adapter run/lora/v10 --save Qwen3-4B-lora-v10
Every adapted linear weight becomes W + scale * B A (scale = lora_alpha / r, or lora_alpha / sqrt(r) with rsLoRA),
computed in fp32 and stored in the base's dtype; every other tensor is copied. The base's config, tokenizer, chat
template and generation config are copied next to the weights, so the output loads as the base does and its
logits equal the base with the adapter applied (transformers + peft). Adapters this run saves (save_adapter, the
LoRA weight updates under <output-dir>/lora/) and PEFT's own (save_pretrained) are both read. DoRA, per-module
ranks or alphas, and embedding adapters are refused with a pointer to peft's merge_and_unload().
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads only when the tool runs: --help stays instant
    import torch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the tool (no heavy import: --help is instant)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hf-checkpoint", required=True, help="the HF base model directory the adapter was trained on")
    p.add_argument("--adapter", required=True, help="PEFT adapter directory (adapter_config.json + safetensors)")
    p.add_argument("--save", required=True, help="output HF directory (created)")
    p.add_argument("--max-shard-size-gb", type=float, default=5.0, help="size of each safetensors file")
    return p.parse_args(argv)


def base_weights(directory: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of an HF directory's safetensors files, one at a time."""
    from safetensors import safe_open

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        sys.exit(f"merge_lora: --hf-checkpoint {directory}: no *.safetensors there (an HF model directory)")
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def main(argv: list[str] | None = None) -> None:
    """Read the adapter, merge it into the base's weights shard by shard, write the HF checkpoint."""
    args = parse_args(argv)
    from slime_like.trainer.megatron import checkpoint_conversion as conv
    from slime_like.trainer.megatron.lora import merge_adapter, merge_scale, read_adapter

    base, save = Path(args.hf_checkpoint), Path(args.save)
    if save.resolve() == base.resolve():
        sys.exit("merge_lora: --save must differ from --hf-checkpoint (the base is read while the output is written)")
    try:
        peft_config, adapter = read_adapter(args.adapter)
        scale = merge_scale(peft_config, args.adapter)
        weights = merge_adapter(base_weights(base), adapter, scale, args.adapter)
        files = conv.write_safetensors(weights, save, int(args.max_shard_size_gb * 1024**3))
    except (FileNotFoundError, ValueError) as exc:
        sys.exit(f"merge_lora: {exc}")
    conv.copy_model_files(base, save)
    print(f"merged {args.adapter} (scale {scale:g}) into {base}: wrote {len(files)} safetensors file(s) to {save}")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script
    main()
