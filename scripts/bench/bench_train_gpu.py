"""Training throughput of the Megatron engine on one device: tokens/s and model FLOPs utilisation (MFU).

    python scripts/bench/bench_train_gpu.py                          # Qwen3-0.6B-shaped dense + a ~1B Qwen3-MoE
    python scripts/bench/bench_train_gpu.py --models dense --seq-len 4096 --seqs-per-step 16
    python scripts/bench/bench_train_gpu.py --tiny                   # tiny sizes: runs anywhere, CPU included
    python scripts/bench/bench_train_gpu.py --fused-elementwise off on --grouped-experts off on  # a row per path
    python scripts/bench/bench_train_gpu.py --attention flex         # torch's core attention path (no TE)

Prints figures, asserts nothing. Each model is written locally as an HF checkpoint with random weights
(transformers, no download), loaded into one MegatronTrainEngine (a world of one), and trained with the
engine's train_step on batches of --seqs-per-step random sequences of --seq-len tokens (packed into micro-batches
of at most --max-tokens-per-micro-batch tokens; a token cross-entropy loss). After --warmup steps, --steps steps
are timed; reported: the median step time, tokens/s, model TFLOP/s and MFU = model FLOP/s / the device's peak
dense bf16 FLOP/s (from its name, or --peak-tflops).

Model FLOPs per step follow PaLM (Chowdhery et al. 2022, appendix B), per token: 6 x N (forward and backward
of every weight matmul; N = active parameters, the output layer counted, the embedding lookup not) +
12 x layers x query heads x head_dim x seq_len (attention scores and values, no causal discount).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slime_like.trainer.megatron.local_kernels_flags import LocalKernels

REPO = Path(__file__).resolve().parents[2]

# Dense bf16 tensor-core peaks (no sparsity), NVIDIA datasheets; the first name fragment found wins.
PEAK_BF16_TFLOPS = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM
    ("H200", 989.0),
    ("H800", 989.0),
    ("A100", 312.0),
    ("B200", 2250.0),
)


@dataclass
class ModelShape:
    """A Qwen3 (dense) or Qwen3-MoE architecture."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int  # dense MLP width, or one expert's width for MoE
    vocab: int
    tied: bool
    experts: int = 0  # 0: dense
    top_k: int = 0

    def params(self) -> tuple[int, int]:
        """(total parameters, active parameters per token for 6N: the output layer in, the embedding lookup out)."""
        h, d = self.hidden, self.head_dim
        attention = h * self.heads * d + 2 * h * self.kv_heads * d + self.heads * d * h + 2 * d  # q k v o, q/k norm
        norms = 2 * h
        if self.experts:
            mlp_total = h * self.experts + self.experts * 3 * h * self.ffn  # router + SwiGLU experts
            mlp_active = h * self.experts + self.top_k * 3 * h * self.ffn
        else:
            mlp_total = mlp_active = 3 * h * self.ffn
        embedding = self.vocab * h
        total = self.layers * (attention + norms + mlp_total) + h + embedding * (1 if self.tied else 2)
        active = self.layers * (attention + norms + mlp_active) + h + embedding
        return total, active

    def flops_per_token(self, seq_len: int) -> float:
        """Model FLOPs of one training token (forward + backward), PaLM's formula."""
        return 6.0 * self.params()[1] + 12.0 * self.layers * self.heads * self.head_dim * seq_len


DENSE = ModelShape("qwen3-0.6b", 1024, 28, 16, 8, 128, 3072, 151936, tied=True)
MOE = ModelShape("qwen3-moe-1b-a0.3b", 1024, 12, 16, 8, 128, 1024, 151936, tied=False, experts=16, top_k=2)
TINY_DENSE = ModelShape("tiny-dense", 64, 2, 4, 2, 16, 128, 512, tied=True)
TINY_MOE = ModelShape("tiny-moe", 64, 2, 4, 2, 16, 64, 512, tied=False, experts=4, top_k=2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the benchmark (--tiny changes the defaults to CPU-sized ones)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["dense", "moe"], choices=["dense", "moe"])
    p.add_argument("--tiny", action="store_true", help="tiny models and batches (a CPU check of the script)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default 2048; --tiny 64)")
    p.add_argument(
        "--seqs-per-step", type=int, default=None, help="sequences per optimizer step (default 32; --tiny 4)"
    )
    p.add_argument("--max-tokens-per-micro-batch", type=int, default=None, help="default 8192; --tiny 128")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 10; --tiny 2)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3; --tiny 1)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--peak-tflops", type=float, default=None, help="peak FLOP/s of the device (default: by name)")
    # Without TE (local_kernels_flags.py); several values run each model once per combination, a table row each.
    p.add_argument(
        "--fused-elementwise",
        nargs="+",
        default=["auto"],
        choices=["auto", "on", "off"],
        help="RMSNorm, RoPE, SwiGLU fused by torch.compile (--local-fused-elementwise)",
    )
    p.add_argument(
        "--grouped-experts",
        nargs="+",
        default=["auto"],
        choices=["auto", "on", "off"],
        help="MoE experts as torch grouped GEMMs (--local-grouped-experts)",
    )
    p.add_argument("--json", default=None, help="also write the figures to this file")
    p.add_argument("--workdir", default=None, help="where the HF checkpoints are written (default: a temp dir)")
    p.add_argument(
        "--attention",
        default="auto",
        choices=["auto", "varlen", "flex", "sdpa", "off"],
        help="--attention-backend-torch: torch's core attention without TE (slime_like/trainer/megatron/torch_attention.py)",
    )
    args = p.parse_args(argv)
    defaults = {"seq_len": (2048, 64), "seqs_per_step": (32, 4), "max_tokens_per_micro_batch": (8192, 128)}
    defaults.update(steps=(10, 2), warmup=(3, 1))
    for key, (full, tiny) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, tiny if args.tiny else full)
    return args


def write_checkpoint(shape: ModelShape, out: Path, max_positions: int) -> Path:
    """An HF Qwen3 / Qwen3-MoE directory with random bf16 weights (config and safetensors only)."""
    import torch
    import transformers

    common = dict(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=max_positions,
        tie_word_embeddings=shape.tied,
        rms_norm_eps=1e-6,
        dtype="bfloat16",
    )
    if shape.experts:
        config = transformers.Qwen3MoeConfig(
            intermediate_size=shape.ffn,
            moe_intermediate_size=shape.ffn,
            num_experts=shape.experts,
            num_experts_per_tok=shape.top_k,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
            **common,
        )
    else:
        config = transformers.Qwen3Config(intermediate_size=shape.ffn, **common)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    return out


def peak_flops(override_tflops: float | None) -> tuple[str, float | None]:
    """The device's name and its peak dense bf16 FLOP/s (None when unknown, e.g. on CPU)."""
    import torch

    if not torch.cuda.is_available():
        return "cpu", None if override_tflops is None else override_tflops * 1e12
    name = torch.cuda.get_device_name()
    if override_tflops is not None:
        return name, override_tflops * 1e12
    for fragment, tflops in PEAK_BF16_TFLOPS:
        if fragment in name:
            return name, tflops * 1e12
    return name, None


def bench_model(
    shape: ModelShape,
    hf_dir: Path,
    args: argparse.Namespace,
    peak: float | None,
    paths: tuple[str, str] = ("auto", "auto"),
) -> dict:
    """Build the engine, run warm-up and timed train steps, return the figures; paths: the local spec's
    (--fused-elementwise, --grouped-experts) values."""
    import torch

    from slime_like.trainer.megatron.cpu_compat import transformer_engine_available
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.local_kernels_flags import choose_local_kernels
    from slime_like.trainer.megatron.optimizer import OptimizerSettings

    cuda = torch.cuda.is_available()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    kernels = choose_local_kernels(*paths, cuda=cuda, transformer_engine=transformer_engine_available())
    engine = MegatronTrainEngine(
        hf_dir,
        OptimizerSettings(lr=1e-5),
        max_tokens_per_micro_batch=args.max_tokens_per_micro_batch,
        dtype=dtype,
        torch_attention=args.attention,
        local_kernels=kernels,
    )
    megatron_params = sum(p.numel() for chunk in engine.model for p in chunk.parameters())
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, shape.vocab, (args.seq_len,), generator=g) for _ in range(args.seqs_per_step)]
    targets = args.seqs_per_step * (args.seq_len - 1)

    def loss_fn(logprobs: list[torch.Tensor], data: list) -> torch.Tensor:
        return -sum(lp.sum() for lp in logprobs) / targets

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(args.warmup + args.steps):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        engine.train_step(seqs, [None] * len(seqs), loss_fn)
        if cuda:
            torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    tokens = args.seqs_per_step * args.seq_len
    median = statistics.median(times)
    model_flops = tokens * shape.flops_per_token(args.seq_len) / median
    total, active = shape.params()
    result = {
        "model": shape.name,
        "shape": asdict(shape),
        "params": total,
        "params_megatron": megatron_params,
        "active_params": active,
        "tokens_per_step": tokens,
        "step_s_median": median,
        "step_s_all": times,
        "tokens_per_s": tokens / median,
        "model_tflops": model_flops / 1e12,
        "mfu": None if peak is None else model_flops / peak,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 1024**3 if cuda else None,
        "paths": paths_label(engine.transformer_engine, kernels),
        "attention": attention_ran(engine),
        "layout": engine.layout,
    }
    del engine
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return result


def attention_ran(engine) -> str:
    """Which core attention the timed steps ran: torch's path(s), or Megatron's (TE or local)."""
    from slime_like.trainer.megatron.torch_attention import attention_paths

    paths = attention_paths(engine.model)
    if paths:
        return "torch " + "+".join(paths)
    return "transformer-engine" if engine.transformer_engine else "megatron-local"


def paths_label(transformer_engine: bool, kernels: LocalKernels) -> str:
    """The elementwise and expert paths a run used: TE's, or the local spec's with or without the faster ones."""
    if transformer_engine:
        return "transformer-engine"
    fused, grouped = ("on" if flag else "off" for flag in (kernels.fused_elementwise, kernels.grouped_experts))
    return f"fused:{fused} grouped:{grouped}"


def _count(n: float) -> str:
    return f"{n / 1e9:.3f}B" if n >= 1e8 else f"{n / 1e6:.3f}M"


def report(device: str, peak: float | None, args: argparse.Namespace, results: list[dict]) -> str:
    """The figures as a text table."""
    peak_text = "unknown: pass --peak-tflops for MFU" if peak is None else f"{peak / 1e12:.0f} TFLOP/s dense bf16"
    lines = [
        f"device: {device} (peak {peak_text}); {args.dtype}; {args.seqs_per_step} x {args.seq_len} tokens per step; "
        f"micro-batches of <= {args.max_tokens_per_micro_batch} tokens; median of {args.steps} steps after "
        f"{args.warmup} warm-up",
        f"{'model':<20} {'params':>9} {'active':>9} {'step s':>9} {'tokens/s':>11} {'model TFLOP/s':>14} "
        f"{'MFU':>7} {'peak mem GiB':>13}  paths",
    ]
    for r in results:
        mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        mem = "-" if r["peak_memory_gib"] is None else f"{r['peak_memory_gib']:.1f}"
        lines.append(
            f"{r['model']:<20} {_count(r['params']):>9} {_count(r['active_params']):>9} "
            f"{r['step_s_median']:>9.3f} {r['tokens_per_s']:>11.1f} {r['model_tflops']:>14.4f} {mfu:>7} {mem:>13}  "
            f"{r['paths']}; attention: {r['attention']}"
        )
    for r in results:
        if r["params"] != r["params_megatron"]:
            lines.append(f"note: {r['model']}: the FLOPs count assumes {r['params']} params, Megatron built "
                         f"{r['params_megatron']}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Entry point."""
    args = parse_args(argv)
    sys.path.insert(0, str(REPO))
    from slime_like.trainer.megatron.parallel import init_parallel

    init_parallel(tp=1, pp=1, seed=1234)
    device, peak = peak_flops(args.peak_tflops)
    shapes = {"dense": TINY_DENSE if args.tiny else DENSE, "moe": TINY_MOE if args.tiny else MOE}
    results = []
    with tempfile.TemporaryDirectory(dir=args.workdir) as work:
        combinations = [(f, g) for f in args.fused_elementwise for g in args.grouped_experts]
        for key, paths in [(key, paths) for key in args.models for paths in combinations]:
            shape = shapes[key]
            hf_dir = Path(work) / shape.name
            if not hf_dir.exists():  # once per model, whatever the number of path combinations
                write_checkpoint(shape, hf_dir, max(4096, args.seq_len))
            results.append(bench_model(shape, hf_dir, args, peak, paths))
            r = results[-1]
            print(
                f"{shape.name}: {r['tokens_per_s']:.1f} tokens/s; attention: {r['attention']} ({r['layout']})",
                flush=True,
            )
    print(report(device, peak, args, results), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device, "peak_flops": peak, "results": results}, indent=1))


if __name__ == "__main__":
    main()
