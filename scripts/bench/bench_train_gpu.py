"""Training throughput of the Megatron engine on one device: tokens/s and model FLOPs utilisation (MFU).

    python scripts/bench/bench_train_gpu.py                          # Qwen3-0.6B-shaped dense + a ~1B Qwen3-MoE
    python scripts/bench/bench_train_gpu.py --models dense --seq-len 4096 --seqs-per-step 16
    python scripts/bench/bench_train_gpu.py --tiny                   # tiny sizes: runs anywhere, CPU included
    python scripts/bench/bench_train_gpu.py --models qwen3-next qwen3.5 qwen3.5-moe   # the hybrid families
    python scripts/bench/bench_train_gpu.py --local-fused-elementwise off on --local-grouped-experts off on  # a row each
    python scripts/bench/bench_train_gpu.py --local-core-attention flex   # torch's core attention path (no TE)

Prints figures, asserts nothing. Each model is written locally as an HF checkpoint with random weights
(transformers, no download), loaded into one MegatronTrainEngine (a world of one), and trained with the
engine's train_step on batches of --seqs-per-step random sequences of --seq-len tokens (packed into micro-batches
of at most --max-tokens-per-micro-batch tokens; a token cross-entropy loss). After --warmup steps, --steps steps
are timed; reported: the median step time, tokens/s, model TFLOP/s and MFU = model FLOP/s / the device's peak
dense bf16 FLOP/s (from its name, or --peak-tflops).

Model FLOPs per step follow PaLM (Chowdhery et al. 2022, appendix B), per token: 6 x N (forward and backward
of every weight matmul; N = active parameters, the output layer counted, the embedding lookup not) +
12 x full-attention layers x query heads x head_dim x seq_len (attention scores and values, no causal discount).
The hybrid families (Qwen3-Next, Qwen3.5: gated delta net layers between gated full-attention layers) add, per
gated delta net layer, 12 x value heads x key head_dim x value head_dim: the recurrent form's state update and
read-out, forward and backward (the chunked kernels do somewhat more). Qwen3.5 checkpoints are vision-language ones:
the bench writes a one-block vision tower, which the text batches leave idle and the FLOPs leave out.
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
    """A Qwen3 (dense) or Qwen3-MoE architecture, or a hybrid one (Qwen3-Next, Qwen3.5 / Qwen3.5-MoE)."""

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
    family: str = "qwen3"  # qwen3 (dense or MoE), qwen3_next or qwen3_5 (hybrid)
    shared_ffn: int = 0  # the hybrid MoE's gated shared expert
    linear_heads: tuple[int, int] = (0, 0)  # the gated delta net's (key heads, value heads)
    linear_head_dims: tuple[int, int] = (0, 0)  # (key head_dim, value head_dim)
    full_attention_interval: int = 1  # hybrid: every n-th layer is full attention, the others gated delta net
    conv_kernel: int = 4

    @property
    def full_attention_layers(self) -> int:
        """Layers of softmax attention (all of them for Qwen3)."""
        return self.layers // self.full_attention_interval

    def params(self) -> tuple[int, int]:
        """(total parameters, active parameters per token for 6N: the output layer in, the embedding lookup out)."""
        h, d = self.hidden, self.head_dim
        gated = self.family != "qwen3"  # Qwen3-Next/3.5 attention: q_proj holds each head's query and output gate
        attention = h * self.heads * d * (2 if gated else 1) + 2 * h * self.kv_heads * d + self.heads * d * h + 2 * d
        (nk, nv), (dk, dv) = self.linear_heads, self.linear_head_dims
        qk, v = nk * dk, nv * dv  # gated delta net: in_proj (q k v z b a), conv1d, A_log, dt_bias, out norm, out_proj
        linear = h * (2 * qk + 2 * v + 2 * nv) + (2 * qk + v) * self.conv_kernel + 2 * nv + dv + v * h
        mixers = self.full_attention_layers * attention + (self.layers - self.full_attention_layers) * linear
        norms = 2 * h
        shared = 3 * h * self.shared_ffn + h if self.shared_ffn else 0  # SwiGLU + its sigmoid gate
        if self.experts:
            mlp_total = h * self.experts + self.experts * 3 * h * self.ffn + shared  # router + SwiGLU experts
            mlp_active = h * self.experts + self.top_k * 3 * h * self.ffn + shared
        else:
            mlp_total = mlp_active = 3 * h * self.ffn
        embedding = self.vocab * h
        total = mixers + self.layers * (norms + mlp_total) + h + embedding * (1 if self.tied else 2)
        active = mixers + self.layers * (norms + mlp_active) + h + embedding
        return total, active

    def flops_per_token(self, seq_len: int) -> float:
        """Model FLOPs of one training token (forward + backward), PaLM's formula (+ the gated delta nets' state)."""
        attention = 12.0 * self.full_attention_layers * self.heads * self.head_dim * seq_len
        (_, nv), (dk, dv) = self.linear_heads, self.linear_head_dims
        linear = 12.0 * (self.layers - self.full_attention_layers) * nv * dk * dv
        return 6.0 * self.params()[1] + attention + linear


DENSE = ModelShape("qwen3-0.6b", 1024, 28, 16, 8, 128, 3072, 151936, tied=True)
MOE = ModelShape("qwen3-moe-1b-a0.3b", 1024, 12, 16, 8, 128, 1024, 151936, tied=False, experts=16, top_k=2)
TINY_DENSE = ModelShape("tiny-dense", 64, 2, 4, 2, 16, 128, 512, tied=True)
TINY_MOE = ModelShape("tiny-moe", 64, 2, 4, 2, 16, 64, 512, tied=False, experts=4, top_k=2)
# Hybrid layouts as the published models' (tools/hf_configs): Qwen3.5-0.8B as it is; Qwen3-Next-80B-A3B's and
# Qwen3.5-35B-A3B's layers (3 gated delta nets per gated attention, 16 key / 32 value heads of 128, attention heads of
# 256, experts of 512 + a gated shared one) at hidden 1024, 12 layers and 32 experts (top-4).
_NEXT = dict(linear_heads=(16, 32), linear_head_dims=(128, 128), full_attention_interval=4)
QWEN3_NEXT = ModelShape("qwen3-next-1.1b-a0.4b", 1024, 12, 16, 2, 256, 512, 151936, tied=False, experts=32, top_k=4,
                        family="qwen3_next", shared_ffn=512, **_NEXT)  # fmt: skip
QWEN3_5 = ModelShape("qwen3.5-0.8b", 1024, 24, 8, 2, 256, 3584, 248320, tied=True, family="qwen3_5",
                     linear_heads=(16, 16), linear_head_dims=(128, 128), full_attention_interval=4)  # fmt: skip
QWEN3_5_MOE = ModelShape("qwen3.5-moe-1.3b-a0.5b", 1024, 12, 16, 2, 256, 512, 248320, tied=False, experts=32,
                         top_k=4, family="qwen3_5", shared_ffn=512, **_NEXT)  # fmt: skip
_TINY_HYBRID = dict(linear_heads=(2, 4), linear_head_dims=(8, 12), full_attention_interval=2)
TINY_QWEN3_NEXT = ModelShape("tiny-qwen3-next", 64, 4, 4, 2, 16, 32, 512, tied=False, experts=4, top_k=2,
                             family="qwen3_next", shared_ffn=48, **_TINY_HYBRID)  # fmt: skip
TINY_QWEN3_5 = ModelShape("tiny-qwen3.5", 64, 4, 4, 2, 32, 96, 512, tied=True, family="qwen3_5", **_TINY_HYBRID)
TINY_QWEN3_5_MOE = ModelShape("tiny-qwen3.5-moe", 64, 4, 4, 2, 32, 32, 512, tied=False, experts=4, top_k=2,
                              family="qwen3_5", shared_ffn=48, **_TINY_HYBRID)  # fmt: skip
# --models name: (full size, --tiny size)
SHAPES = {
    "dense": (DENSE, TINY_DENSE),
    "moe": (MOE, TINY_MOE),
    "qwen3-next": (QWEN3_NEXT, TINY_QWEN3_NEXT),
    "qwen3.5": (QWEN3_5, TINY_QWEN3_5),
    "qwen3.5-moe": (QWEN3_5_MOE, TINY_QWEN3_5_MOE),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the benchmark (--tiny changes the defaults to CPU-sized ones)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--models",
        nargs="+",
        default=["dense", "moe"],
        choices=list(SHAPES),
        help="Qwen3 dense / MoE, or the hybrid Qwen3-Next, Qwen3.5 and Qwen3.5-MoE (their gated delta net needs "
        "flash-linear-attention on a GPU)",
    )
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
    # The trainer's flags without TE (local_kernels_flags.py); here several values of the two kernel switches run
    # each model once per combination, a table row each.
    p.add_argument(
        "--local-fused-elementwise",
        nargs="+",
        default=["auto"],
        choices=["auto", "on", "off"],
        help="RMSNorm (zero-centred too), RoPE, SwiGLU fused by torch.compile; one or more values",
    )
    p.add_argument(
        "--local-grouped-experts",
        nargs="+",
        default=["auto"],
        choices=["auto", "on", "off"],
        help="MoE experts as torch grouped GEMMs; one or more values",
    )
    p.add_argument("--json", default=None, help="also write the figures to this file")
    p.add_argument("--workdir", default=None, help="where the HF checkpoints are written (default: a temp dir)")
    p.add_argument(
        "--local-core-attention",
        default="auto",
        choices=["auto", "varlen", "flex", "sdpa", "off"],
        help="torch's core attention without TE (slime_like/trainer/megatron/torch_attention.py)",
    )
    args = p.parse_args(argv)
    defaults = {"seq_len": (2048, 64), "seqs_per_step": (32, 4), "max_tokens_per_micro_batch": (8192, 128)}
    defaults.update(steps=(10, 2), warmup=(3, 1))
    for key, (full, tiny) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, tiny if args.tiny else full)
    return args


def hybrid_config(shape: ModelShape, common: dict):
    """The transformers config of a Qwen3-Next or Qwen3.5(-MoE) shape (Qwen3.5: a vision-language checkpoint with a
    one-block vision tower, as the published checkpoints hold the text model beside one)."""
    import transformers

    (nk, nv), (dk, dv) = shape.linear_heads, shape.linear_head_dims
    half = int(shape.head_dim * 0.25) // 2  # a quarter of each head rotates; mrope splits its frequencies in three
    third, rest = divmod(half, 3)  # Qwen3.5-0.8B: 32 frequencies as [11, 11, 10]
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}
    hybrid = dict(
        linear_num_key_heads=nk, linear_num_value_heads=nv, linear_key_head_dim=dk, linear_value_head_dim=dv,
        linear_conv_kernel_dim=shape.conv_kernel, full_attention_interval=shape.full_attention_interval,
    )  # fmt: skip
    if shape.experts:
        hybrid.update(
            num_experts=shape.experts,
            num_experts_per_tok=shape.top_k,
            moe_intermediate_size=shape.ffn,
            shared_expert_intermediate_size=shape.shared_ffn,
        )
    if shape.family == "qwen3_next":
        moe = dict(mlp_only_layers=[], decoder_sparse_step=1, norm_topk_prob=True)
        return transformers.Qwen3NextConfig(
            intermediate_size=shape.ffn, rope_parameters=rope, **moe, **hybrid, **common
        )
    rope.update(mrope_section=[third + (rest > 0), third + (rest > 1), third], mrope_interleaved=True)
    text = dict(intermediate_size=shape.ffn, rope_parameters=rope, **hybrid, **common)
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=shape.hidden,
                  num_position_embeddings=16)  # fmt: skip
    config_class = transformers.Qwen3_5MoeConfig if shape.experts else transformers.Qwen3_5Config
    return config_class(text_config=text, vision_config=vision, tie_word_embeddings=shape.tied)


def hf_config(shape: ModelShape, max_positions: int):
    """The transformers config of a shape (Qwen3, Qwen3-MoE, Qwen3-Next, Qwen3.5, Qwen3.5-MoE)."""
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
    if shape.family != "qwen3":
        return hybrid_config(shape, common)
    if shape.experts:
        return transformers.Qwen3MoeConfig(
            intermediate_size=shape.ffn,
            moe_intermediate_size=shape.ffn,
            num_experts=shape.experts,
            num_experts_per_tok=shape.top_k,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
            **common,
        )
    return transformers.Qwen3Config(intermediate_size=shape.ffn, **common)


def hf_model_class(shape: ModelShape):
    """The transformers auto class of a shape's checkpoint (Qwen3.5's are vision-language ones)."""
    import transformers

    return transformers.AutoModelForImageTextToText if shape.family == "qwen3_5" else transformers.AutoModelForCausalLM


def write_checkpoint(shape: ModelShape, out: Path, max_positions: int) -> Path:
    """An HF Qwen3 / Qwen3-MoE / Qwen3-Next / Qwen3.5 directory with random bf16 weights (config and safetensors)."""
    import torch

    torch.manual_seed(0)
    model = hf_model_class(shape).from_config(hf_config(shape, max_positions), dtype=torch.bfloat16)
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
    (--local-fused-elementwise, --local-grouped-experts) values."""
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
        torch_attention=args.local_core_attention,
        local_kernels=kernels,
    )
    # The vision tower of a Qwen3.5 checkpoint is counted apart: text batches leave it idle.
    named = [(n, p.numel()) for chunk in engine.model for n, p in chunk.named_parameters()]
    vision_params = sum(count for name, count in named if ".visual." in f".{name}")
    megatron_params = sum(count for _, count in named) - vision_params
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
        "params_vision": vision_params,
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
    shapes = {key: pair[1] if args.tiny else pair[0] for key, pair in SHAPES.items()}
    results = []
    with tempfile.TemporaryDirectory(dir=args.workdir) as work:
        combinations = [(f, g) for f in args.local_fused_elementwise for g in args.local_grouped_experts]
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
