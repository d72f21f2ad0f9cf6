"""Write a tiny, randomly initialised Hugging Face checkpoint that SGLang and Megatron can both load.

Example: python tools/make_tiny_model.py --out /tmp/tiny-qwen3 --family qwen3
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

FAMILIES = ("qwen3", "qwen2", "llama", "qwen3_moe", "qwen3_next")

# Qwen-style chat template: the role header, the content, an end-of-turn token.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]

_WORDS = (
    "the a an of to and in is it that for on with as was by at be this what how many "
    "answer question problem number numbers sum total add plus minus times divided "
    "equals result compute calculate please give final think step first then so "
    "has have had apples books cars coins left more less each every one two three "
    "four five six seven eight nine ten hundred user assistant system you are helpful"
).split()


def builtin_corpus(seed: int = 0, lines: int = 4000) -> list[str]:
    """A small synthetic corpus: English-like sentences, arithmetic and chat turns."""
    rng = random.Random(seed)
    corpus = []
    for _ in range(lines):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        op = rng.choice(["+", "-", "*"])
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        sentence = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 14)))
        corpus.append(f"{sentence.capitalize()}. What is {a} {op} {b}? Answer: {value}")
        corpus.append(f"<|im_start|>user\n{a} {op} {b} = ?<|im_end|>\n<|im_start|>assistant\n{value}<|im_end|>")
    return corpus


def train_tokenizer(vocab_size: int, seed: int):
    """Train a byte-level BPE tokenizer with single-digit tokens (helps arithmetic tasks)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(builtin_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=["<|endoftext|>", "<|im_start|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_config(family: str, vocab_size: int, args: argparse.Namespace, eos_id: int, pad_id: int):
    """The transformers config for one family, sized by the command-line arguments."""
    import transformers

    common = dict(
        vocab_size=vocab_size,
        hidden_size=args.hidden_size,
        intermediate_size=args.ffn_hidden_size,
        num_hidden_layers=args.num_layers,
        num_attention_heads=args.num_heads,
        num_key_value_heads=args.num_kv_heads,
        max_position_embeddings=args.max_position_embeddings,
        tie_word_embeddings=args.tie_word_embeddings,
        rms_norm_eps=1e-6,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=eos_id,
        dtype="float32",
    )
    if family == "qwen3":
        return transformers.Qwen3Config(head_dim=args.hidden_size // args.num_heads, **common)
    if family == "qwen2":
        return transformers.Qwen2Config(**common)
    if family == "llama":
        return transformers.LlamaConfig(head_dim=args.hidden_size // args.num_heads, **common)
    if family == "qwen3_moe":
        return transformers.Qwen3MoeConfig(
            head_dim=args.hidden_size // args.num_heads,
            num_experts=args.num_experts,
            num_experts_per_tok=args.moe_top_k,
            moe_intermediate_size=args.ffn_hidden_size,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
            **common,
        )
    if family == "qwen3_next":
        # Gated delta net and gated attention alternating; heads split as Qwen3-Next-80B-A3B's (2 value heads per key
        # head); MoE with a gated shared expert in every layer (SGLang builds every layer MoE).
        head_dim = args.hidden_size // args.num_heads
        return transformers.Qwen3NextConfig(
            head_dim=head_dim,
            full_attention_interval=2,
            linear_num_key_heads=args.num_kv_heads,
            linear_num_value_heads=2 * args.num_kv_heads,
            linear_key_head_dim=head_dim,
            linear_value_head_dim=head_dim,
            num_experts=args.num_experts,
            num_experts_per_tok=args.moe_top_k,
            moe_intermediate_size=args.ffn_hidden_size,
            shared_expert_intermediate_size=args.ffn_hidden_size,
            mlp_only_layers=[],
            norm_topk_prob=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
            **common,
        )
    raise ValueError(f"--family must be one of {FAMILIES}, got {family!r}")


def make_tiny_model(args: argparse.Namespace) -> Path:
    """Write config, random weights, tokenizer, chat template and generation config to args.out."""
    import torch
    import transformers

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(args.vocab_size, args.seed)
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|pad|>")
    config = build_config(args.family, len(tokenizer), args, eos_id, pad_id)
    torch.manual_seed(args.seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    if args.family == "qwen3_next":  # the published config.json's fields, which SGLang reads
        saved = json.loads((out / "config.json").read_text())
        saved.update(full_attention_interval=2, rope_theta=10000.0, partial_rotary_factor=0.25)
        (out / "config.json").write_text(json.dumps(saved, indent=2))
    write_tokenizer_and_record(out, tokenizer, eos_id, pad_id, args)
    return out


def write_tokenizer_and_record(out: Path, tokenizer, eos_id: int, pad_id: int, args: argparse.Namespace) -> None:
    """The tail every tiny checkpoint shares: its tokenizer, a generation config and the arguments it was made with."""
    import transformers

    tokenizer.save_pretrained(out)
    gen = transformers.GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=eos_id)
    gen.save_pretrained(out)
    (out / "slime_like_tiny.json").write_text(json.dumps(vars(args), indent=1, default=str))


def add_lm_arguments(
    p: argparse.ArgumentParser,
    max_position_embeddings: int = 2048,
    moe_families: str = "qwen3_moe and qwen3_next",
    num_layers: int | None = 2,
    num_layers_help: str | None = None,
) -> None:
    """The language model's size flags (and seed) both tiny-checkpoint tools take, with each tool's defaults."""
    p.add_argument("--vocab-size", type=int, default=512, help="tokenizer vocabulary size to train")
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--ffn-hidden-size", type=int, default=128, help="dense MLPs' width, and each expert's")
    p.add_argument("--num-layers", type=int, default=num_layers, help=num_layers_help)
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--num-kv-heads", type=int, default=2)
    p.add_argument("--max-position-embeddings", type=int, default=max_position_embeddings)
    p.add_argument("--num-experts", type=int, default=4, help=f"{moe_families} only")
    p.add_argument("--moe-top-k", type=int, default=2, help=f"{moe_families} only")
    p.add_argument("--tie-word-embeddings", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--seed", type=int, default=0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the tool."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output directory (created)")
    p.add_argument("--family", default="qwen3", choices=FAMILIES)
    add_lm_arguments(p)
    return p.parse_args(argv)


if __name__ == "__main__":
    print(make_tiny_model(parse_args()))
