"""Supervised warm start through the training engine: fit prompt -> response pairs, write an HF checkpoint.

Example: python tools/sft_warmstart.py --hf-checkpoint tiny --data sft.jsonl --out tiny-sft --steps 40
Each row is {"prompt": ..., "response": ...}; the loss covers the response tokens and the end token.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
from pathlib import Path

from slime_like.core.logs import setup_logging


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the tool."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hf-checkpoint", required=True)
    p.add_argument("--data", required=True, help="jsonl with prompt and response keys")
    p.add_argument("--out", required=True, help="output HF checkpoint directory")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Train, then export the weights with the original config and tokenizer."""
    args = parse_args(argv)
    setup_logging("sft_warmstart")
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.optimizer import OptimizerSettings
    from slime_like.trainer.megatron.parallel import init_parallel

    tok = AutoTokenizer.from_pretrained(args.hf_checkpoint)
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()]
    examples = []
    for row in rows:
        prompt = tok(row["prompt"], add_special_tokens=False)["input_ids"]
        response = tok(row["response"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        examples.append((prompt + response, len(response)))
    init_parallel(seed=args.seed)
    engine = MegatronTrainEngine(args.hf_checkpoint, OptimizerSettings(lr=args.lr, use_distributed_optimizer=False))
    rng = random.Random(args.seed)

    for step in range(args.steps):
        batch = rng.sample(examples, min(args.batch_size, len(examples)))
        total = sum(n for _, n in batch)

        def loss_fn(logprobs: list[torch.Tensor], data: list[int], total: int = total) -> torch.Tensor:
            return -sum(lp[-n:].sum() for lp, n in zip(logprobs, data, strict=True)) / total

        metrics = engine.train_step([t for t, _ in batch], [n for _, n in batch], loss_fn)
        if step % 10 == 0 or step == args.steps - 1:
            print(f"[sft {step}] loss={metrics['loss']:.4f} grad_norm={metrics['grad_norm']:.3f}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    src = Path(args.hf_checkpoint)
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            shutil.copy(f, out / f.name)
    weights = {name: t.detach().clone().contiguous() for name, t in engine.export_hf_weights()}
    save_file(weights, out / "model.safetensors")
    print(out)


if __name__ == "__main__":
    main()
