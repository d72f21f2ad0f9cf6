"""Supervised warm start of a vision-language checkpoint: fit image prompt -> answer pairs, write an HF checkpoint.

The VLM demo's first step (scripts/run-tiny-vlm-cpu.sh): RL from a random model never samples a right answer, so a
short SFT teaches the answer format and a rough count. It runs transformers' model and the checkpoint's processor on
CPU (the tiny Qwen2.5-VL of tools/make_tiny_vlm.py trains in a few minutes on 2 cores). Prompts are built exactly as
the RL data path builds them (buffer/multimodal.py: `<image>` placeholders -> image parts -> the chat template ->
the processor), so the warm start sees the ids the rollout will send; the loss covers the answer and the end token.

Example: python tools/sft_warmstart_vlm.py --hf-checkpoint tiny-vl --data sft.parquet --out tiny-vl-sft --steps 150
The data is parquet (or jsonl) in geo3k's columns: --input-key problem, --label-key answer, --image-key images.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository root importable for buffer
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the tool."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hf-checkpoint", required=True, help="a vision-language checkpoint with its processor")
    p.add_argument("--data", required=True, help="parquet or jsonl rows with a prompt, an answer and images")
    p.add_argument("--out", required=True, help="output HF checkpoint directory")
    p.add_argument("--input-key", default="problem")
    p.add_argument("--label-key", default="answer")
    p.add_argument("--image-key", default="images")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--eval-data", default=None, help="print the first answer token's greedy accuracy on these rows")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The data file's rows (parquet or jsonl)."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    import json

    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def encode(processor: Any, row: dict[str, Any], args: argparse.Namespace, base_dir: Path) -> dict[str, Any]:
    """One example: prompt + answer + end ids, the number of answer tokens, and the image tensors."""
    import torch

    from buffer import multimodal as mm

    images = mm.row_images(row, args.image_key, base_dir)
    text = mm.render_text(processor, mm.build_messages(row[args.input_key], images))
    prompt_ids, train_inputs = mm.process(processor, text, images)
    tokenizer = processor.tokenizer
    answer = tokenizer(str(row[args.label_key]), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return {"ids": torch.tensor(prompt_ids + answer), "n_answer": len(answer), **(train_inputs or {})}


def loss_of(model: Any, batch: list[dict[str, Any]], image_token_id: int) -> Any:
    """Mean cross-entropy over the answer tokens of a batch (right-padded, images concatenated in order)."""
    import torch

    width = max(len(ex["ids"]) for ex in batch)
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, ex in enumerate(batch):
        n = len(ex["ids"])
        ids[i, :n], mask[i, :n] = ex["ids"], 1
        labels[i, n - ex["n_answer"] : n] = ex["ids"][n - ex["n_answer"] :]
    extra = {k: torch.cat([ex[k] for ex in batch]) for k in ("pixel_values", "image_grid_thw") if k in batch[0]}
    logits = model(input_ids=ids, attention_mask=mask, mm_token_type_ids=(ids == image_token_id).long(), **extra).logits
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)


def first_token_accuracy(model: Any, examples: list[dict[str, Any]], image_token_id: int) -> float:
    """How often the greedy first answer token is right (the answer itself when it is one token)."""
    import torch

    right = 0
    with torch.no_grad():
        for ex in examples:
            ids = ex["ids"][: len(ex["ids"]) - ex["n_answer"]][None]
            extra = {k: ex[k] for k in ("pixel_values", "image_grid_thw") if k in ex}
            logits = model(input_ids=ids, mm_token_type_ids=(ids == image_token_id).long(), **extra).logits
            right += int(logits[0, -1].argmax()) == int(ex["ids"][len(ex["ids"]) - ex["n_answer"]])
    return right / max(len(examples), 1)


def main(argv: list[str] | None = None) -> None:
    """Train, then write the weights with the original config, processor and tokenizer."""
    args = parse_args(argv)
    import torch
    from transformers import AutoModelForImageTextToText

    from buffer import multimodal as mm

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    processor = mm.load_processor(args.hf_checkpoint)
    data = Path(args.data)
    examples = [encode(processor, row, args, data.parent) for row in read_rows(data)]
    model = AutoModelForImageTextToText.from_pretrained(args.hf_checkpoint, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    image_token_id = model.config.image_token_id
    start = time.monotonic()
    for step in range(args.steps):
        loss = loss_of(model, rng.sample(examples, min(args.batch_size, len(examples))), image_token_id)
        optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 10 == 0 or step == args.steps - 1:
            print(
                f"[sft {step}] loss={loss.item():.4f} grad_norm={grad_norm.item():.3f} {time.monotonic() - start:.0f}s",
                flush=True,
            )
    if args.eval_data:
        model.eval()
        held_out = [encode(processor, row, args, data.parent) for row in read_rows(Path(args.eval_data))]
        print(
            f"[sft] first-token greedy accuracy on {args.eval_data}: "
            f"{first_token_accuracy(model, held_out, image_token_id):.3f}",
            flush=True,
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for f in Path(args.hf_checkpoint).iterdir():  # processor, tokenizer, generation config, the tool's notes
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            shutil.copy(f, out / f.name)
    model.save_pretrained(out, safe_serialization=True)
    print(out)


if __name__ == "__main__":
    main()
