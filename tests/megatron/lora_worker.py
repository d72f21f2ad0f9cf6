"""torchrun worker of test_lora.py: the same LoRA run at TP=2; rank 0 saves the results; a PEFT export and a
torch_dist checkpoint are written."""

from __future__ import annotations

import sys

import torch

from slime_like.trainer.megatron.parallel import init_parallel
from tests.megatron.test_lora import lora_run


def main(hf_dir: str, out: str, adapter_dir: str, checkpoint_dir: str) -> None:
    init_parallel(tp=2, pp=1, seed=1234)
    result = lora_run(hf_dir, adapter_dir)
    result["engine"].save_checkpoint(checkpoint_dir, iteration=2)
    if torch.distributed.get_rank() == 0:
        keep = ("base", "start", "trained", "metrics")
        torch.save({k: result[k] for k in keep}, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
