"""Benchmark: a LoRA adapter update vs the full-weight update, bytes and seconds; prints figures, asserts nothing.

    .venv/bin/python scripts/bench/bench_lora_update.py                 # ~400 MB fp32 model, rank 16, all-linear
    .venv/bin/python scripts/bench/bench_lora_update.py --num-layers 2 --repeats 2

The model is bench_weights.py's (tools/make_tiny_model.py: Qwen3, hidden 1024, ffn 3072, 8 layers, untied, fp32),
loaded into a one-rank Megatron engine with LoRA adapters on it (B drawn at random, so the served policy is not the
base). One fp32 SGLang server serves the base with LoRA enabled (on CPU the torch_native LoRA backend), and the same
run times, best of --repeats after a warm-up:
- the full-weight update with each --transports kind (the whole HF model, as a full-weight run sends it),
- the LoRA update (weights/lora.py) on both media: from shared memory (lora/tensor, the default when the servers
  run on this machine: copy into a shared buffer, unload, /load_lora_adapter_from_tensors) and from disk
  (lora/disk: write the PEFT directory, unload, load it by path).
Each row gives the bytes moved, the whole update (pause, flush, send, version tag, continue) and the data path
alone (the transport's send); the last column is the row's seconds over lora/tensor's (goal >= 20 for full rows).
More rows price the LoRA update's parts: "protocol only" is the update with nothing sent (pause, flush, version
tag, continue: the floor of any update); each medium's send split into export, prepare, unload and load; and one request
through SGLang's tokenizer manager and scheduler that does no work (the floor of the unload and of the load).
All best of --repeats. At the end the served log-probs under the adapter are compared with the
trainer's (a sanity check of the figures).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts" / "bench"))
GOAL = 20.0  # full update seconds / LoRA update seconds


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the benchmark (the model's are bench_weights.py's)."""
    from bench_weights import add_model_arguments

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(p)
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--lora-alpha", type=float, default=32.0)
    p.add_argument("--target-modules", default="all-linear")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--transports", nargs="+", default=["distributed", "tensor", "disk"], help="full-weight kinds")
    return p.parse_args(argv)


def best_update(channel, export, repeats: int, version: list[int]) -> tuple[float, float]:
    """Best of `repeats` whole updates and of `repeats` bare sends, after one warm-up update."""
    full = send = float("inf")
    for i in range(repeats + 1):
        version[0] += 1
        start = time.perf_counter()
        channel.update(export(), version[0])
        if i:
            full = min(full, time.perf_counter() - start)
    for _ in range(repeats):
        version[0] += 1
        start = time.perf_counter()
        channel.send(export(), version[0])
        send = min(send, time.perf_counter() - start)
    return full, send


def protocol_only(urls: list[str]):
    """A transport that sends nothing: its update is the protocol alone."""
    from slime_like.trainer.weights.base import WeightTransport

    class Nothing(WeightTransport):
        name = "nothing"

        def send(self, named_tensors, version: int) -> None:
            """Send nothing."""

    return Nothing(urls, bucket_bytes=0, timeout_s=600)


def lora_parts(lora, export, repeats: int) -> dict[str, float]:
    """Best seconds of the LoRA send's parts on its medium: export (Megatron to PEFT-named tensors), prepare
    (tensor: copy into the shared buffer and serialize the handles; disk: write the PEFT directory), unload the
    adapter, load the new one."""
    from rollout import sglang_client as client
    from slime_like.trainer.megatron.lora import write_adapter

    url, target = lora.server_urls[0], lora.directory / "parts"
    best = dict.fromkeys(("export", "prepare", "unload", "load"), float("inf"))
    for _ in range(repeats):
        start = time.perf_counter()
        tensors = dict(export())
        best["export"] = min(best["export"], time.perf_counter() - start)
        start = time.perf_counter()
        if lora.medium == "tensor":
            source, load = lora._share(tensors), client.load_lora_adapter_from_tensors
        else:
            source, load = (
                (str(write_adapter(target, tensors, lora.settings, lora.base_model)),),
                client.load_lora_adapter,
            )
        best["prepare"] = min(best["prepare"], time.perf_counter() - start)
        start = time.perf_counter()
        client.unload_lora_adapter(url, lora.adapter_name, 600, held=True)
        best["unload"] = min(best["unload"], time.perf_counter() - start)
        start = time.perf_counter()
        load(url, lora.adapter_name, *source, 600)
        best["load"] = min(best["load"], time.perf_counter() - start)
    return best


def round_trip(url: str, repeats: int) -> float:
    """Best seconds of one request through SGLang's HTTP server, tokenizer manager and scheduler with no work
    in it (/flush_cache on an idle server): the floor of every unload and load."""
    from rollout import sglang_client as client

    best = float("inf")
    for _ in range(repeats * 4):
        start = time.perf_counter()
        client.post(url, "/flush_cache", timeout=60)
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> None:
    """Make the model, start one LoRA-enabled server, time the full and the LoRA updates, print the table."""
    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    from bench_weights import make_model, transport

    from rollout import sglang_client as client
    from rollout.sglang_server import SGLangServer
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.lora import LoraSettings
    from slime_like.trainer.megatron.lora_flags import resolve_targets, sglang_lora_flags
    from slime_like.trainer.megatron.parallel import destroy_parallel, init_parallel
    from slime_like.trainer.weights.check import probe_tokens, served_logprobs, trainer_logprobs
    from slime_like.trainer.weights.lora import LoraTransport

    targets = resolve_targets(args.target_modules)
    settings = LoraSettings(args.lora_rank, args.lora_alpha, targets=targets)
    with tempfile.TemporaryDirectory(prefix="bench_lora_") as tmp:
        work = Path(tmp)
        model = Path(args.model) if args.model else make_model(args, work / "model")
        init_parallel()
        engine = MegatronTrainEngine(model, optimizer=None, lora=settings)
        with torch.no_grad():  # a trained-looking adapter: B != 0, so the served policy differs from the base
            g = torch.Generator().manual_seed(0)
            for name, param in engine.model[0].named_parameters():
                if name.endswith(".lora.B"):
                    param.copy_(torch.randn(param.shape, generator=g) * 0.02)
        full_bytes = sum(t.numel() * t.element_size() for _, t in engine.export_hf_weights())
        lora_bytes = sum(t.numel() * t.element_size() for _, t in engine.export_adapter())
        server = SGLangServer(
            model,
            dtype="float32",
            extra_args=sglang_lora_flags(settings.rank, targets),
            log_dir=work / "logs",
            startup_timeout=600,
        )
        version = [0]
        print(
            f"model: {model} ({full_bytes / 1e6:.0f} MB fp32), LoRA rank {settings.rank} alpha {settings.alpha:g} on "
            f"{','.join(targets)} ({lora_bytes / 1e6:.2f} MB of adapter tensors), one server, best of "
            f"{args.repeats}, {torch.get_num_threads()} torch thread(s)"
        )
        try:
            server.start()
            url = server.url
            rows = []
            for kind in args.transports:
                channel = transport(kind, [url], args.bucket_mb * 1024**2, model, work / "disk")
                try:
                    rows.append((f"full/{kind}", full_bytes, *best_update(channel, engine.export_hf_weights,
                                                                          args.repeats, version)))  # fmt: skip
                finally:
                    channel.close()
            media = {}
            for medium in ("tensor", "disk"):  # one server on this machine: "auto" picks tensor
                media[medium] = LoraTransport([url], settings, str(model), work / "lora", timeout_s=600, medium=medium)
                lora_full, lora_send = best_update(media[medium], engine.export_adapter, args.repeats, version)
                rows.append((f"lora/{medium}", media[medium].bytes_sent, lora_full, lora_send))
            lora_full = rows[-2][2]  # the ratios are against the LoRA update from shared memory (the default here)
            rows.append(("protocol only", 0, *best_update(protocol_only([url]), lambda: [], args.repeats, version)))
            print(f"{'update':<18}{'MB moved':>10}{'update s':>10}{'send s':>9}{'/ lora':>11}")
            for name, nbytes, full, send in rows:
                ratio = full / lora_full
                mark = (
                    "" if not name.startswith("full") else ("  goal met" if ratio >= GOAL else f"  goal >= {GOAL:g}x")
                )
                print(f"{name:<18}{nbytes / 1e6:>10.2f}{full:>10.4f}{send:>9.4f}{ratio:>10.1f}x{mark}")
            for medium, lora in media.items():
                parts = lora_parts(lora, engine.export_adapter, args.repeats)
                print(f"lora/{medium} send parts (best s): " + ", ".join(f"{k} {v:.4f}" for k, v in parts.items()))
            print(f"one request through SGLang's tokenizer manager and scheduler, no work (best s): "
                  f"{round_trip(url, args.repeats):.4f}")  # fmt: skip
            print(f"lora bytes moved: the flat shared buffer ({media['tensor'].bytes_sent} B) or the PEFT directory "
                  f"({media['disk'].bytes_sent} B); q/k/v and gate/up each repeat the shared A; full: the exported "
                  f"HF tensors ({full_bytes} B)")  # fmt: skip
            probe = probe_tokens(engine.bridge.hf_config.vocab_size)
            served = served_logprobs(url, probe, lora_path=client.LORA_ADAPTER_NAME)
            worst = float((served - trainer_logprobs(engine, probe)).abs().max())
            moved = float((served - served_logprobs(url, probe)).abs().max())
            print(f"check: served under the adapter vs trainer {worst:.2g}; adapter vs base {moved:.2g}")
        finally:
            server.stop()
            destroy_parallel()


if __name__ == "__main__":
    main()
