"""Benchmark: a LoRA adapter update vs the full-weight update, bytes and seconds; prints figures, asserts nothing.

    .venv/bin/python scripts/bench/bench_lora_update.py                 # ~400 MB fp32 model, rank 16, all-linear
    .venv/bin/python scripts/bench/bench_lora_update.py --num-layers 2 --repeats 2

The model is bench_weights.py's (tools/make_tiny_model.py: Qwen3, hidden 1024, ffn 3072, 8 layers, untied, fp32),
loaded into a one-rank Megatron engine with LoRA adapters on it (B drawn at random, so the served policy is not the
base). One fp32 SGLang server serves the base with LoRA enabled (on CPU the torch_native LoRA backend), and the same
run times, in --rounds rounds of --repeats updates each (after a warm-up update), best and median over all rounds:
- the full-weight update with each --transports kind (the whole HF model, as a full-weight run sends it: pause,
  flush, send, version tag, continue);
- the LoRA update (weights/lora.py) on both media, each one request per server (rollout/sglang_launch.py's swap:
  pause, unload, load, version tag, continue inside the server): from shared memory (lora/tensor, the default when
  the servers run on this machine: the adapter copied into a shared buffer in SGLang's stacked layout, loaded from
  its handles) and from disk (lora/disk: the PEFT directory written, loaded by path); and lora/tensor as five
  separate requests, as for a server started without rollout.sglang_launch.
The last column is the full rows' seconds over lora/tensor's (goal >= 20), and a line gives that ratio for the first
full kind in each round (the rows of one round ran minutes apart at most, under about the same load). Then the LoRA update from shared memory
split into its phases (the export from Megatron, the copy into the shared buffer with the serialization of its
handles, the request; within the request the server's own steps, and the rest: HTTP, JSON, the tokenizer manager),
and two floors: one request through SGLang's HTTP server that does no work (POST /update_weight_version on a kept
connection) and one swap of no adapter (pause and continue). At the end the served log-probs under the adapter are
compared with the trainer's (a sanity check of the figures). The load average is printed before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
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
    p.add_argument("--repeats", type=int, default=5, help="timed updates per row and round")
    p.add_argument("--rounds", type=int, default=3, help="rounds over every row (the load changes between them)")
    p.add_argument("--transports", nargs="+", default=["distributed", "tensor", "disk"], help="full-weight kinds")
    return p.parse_args(argv)


def load_average() -> str:
    """The 1-minute load average (other jobs on the same cores skew every figure)."""
    return f"{os.getloadavg()[0]:.1f}"


def timed_updates(channel, export, repeats: int, version: list[int], each=None) -> list[float]:
    """Seconds of `repeats` whole updates after one warm-up; `each(channel)` after every timed one."""
    seconds = []
    for i in range(repeats + 1):
        version[0] += 1
        start = time.perf_counter()
        channel.update(export(), version[0])
        if i:
            seconds.append(time.perf_counter() - start)
            if each is not None:
                each(channel)
    return seconds


def best_and_median(values: list[float]) -> tuple[float, float]:
    return min(values), statistics.median(values)


class Phases:
    """The LoRA update's phases, recorded after each timed update (`record`): the transport's prepare (export, copy
    into the shared buffer, serialization) and request, the server's steps within the request, and the export
    timed apart (`time_export`), from which copy and serialization = prepare - export."""

    def __init__(self) -> None:
        self.seconds: dict[str, list[float]] = {}

    def add(self, name: str, seconds: float) -> None:
        self.seconds.setdefault(name, []).append(seconds)

    def record(self, channel) -> None:
        steps = channel.server_timings[channel.server_urls[0]]
        for name, seconds in channel.timings.items():
            self.add(name, seconds)
        for name, seconds in steps.items():
            self.add(f"server: {name}", seconds)
        self.add("server: all steps", sum(steps.values()))
        self.add("request minus server steps", channel.timings["requests"] - sum(steps.values()))

    def time_export(self, export, repeats: int) -> None:
        for _ in range(repeats):
            start = time.perf_counter()
            dict(export())
            self.add("export", time.perf_counter() - start)

    def table(self) -> list[str]:
        self.seconds["copy and serialize"] = [
            max(0.0, p - min(self.seconds["export"])) for p in self.seconds["prepare"]
        ]
        lines = []
        for name in ("prepare", "export", "copy and serialize", "requests", "server: all steps", "server: pause",
                     "server: unload", "server: load", "server: continue", "request minus server steps"):  # fmt: skip
            if name in self.seconds:
                best, median = best_and_median(self.seconds[name])
                lines.append(f"  {name:<38}{best * 1e3:>6.2f}{median * 1e3:>8.2f}")
        return lines


def floors(url: str, repeats: int) -> tuple[float, float]:
    """Best seconds of one request that does no work through SGLang's HTTP server (kept connection), and of one
    swap of no adapter (pause and continue in one request)."""
    from rollout import sglang_client as client

    server = client.KeptAlive(url)
    bare = swap = float("inf")
    version = client.weight_version(url)
    for _ in range(repeats * 2):
        start = time.perf_counter()
        server.post("/update_weight_version", {"new_version": version, "abort_all_requests": False}, 60)
        bare = min(bare, time.perf_counter() - start)
        start = time.perf_counter()
        client.swap_lora_adapters(server, [], version, timeout=60)
        swap = min(swap, time.perf_counter() - start)
    server.close()
    return bare, swap


def main(argv: list[str] | None = None) -> None:
    """Make the model, start one LoRA-enabled server, time the full and the LoRA updates, print the tables."""
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

    load_before = load_average()
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
        peft_bytes = sum(t.numel() * t.element_size() for _, t in engine.export_adapter())
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
            f"{','.join(targets)} ({peft_bytes / 1e6:.2f} MB of PEFT tensors), one server, {args.rounds} rounds of "
            f"{args.repeats} updates per row, {torch.get_num_threads()} torch thread(s); load average {load_before} "
            "before"
        )
        try:
            server.start()
            url = server.url
            channels = {f"full/{kind}": transport(kind, [url], args.bucket_mb * 1024**2, model, work / "disk")
                        for kind in args.transports}  # fmt: skip
            for medium in ("tensor", "disk"):  # one server on this machine: "auto" picks tensor
                channels[f"lora/{medium}"] = LoraTransport(
                    [url], settings, str(model), work / "lora", timeout_s=600, medium=medium
                )
            channels["lora/tensor, 5 requests"] = LoraTransport(
                [url], settings, str(model), work / "lora", timeout_s=600, medium="tensor"
            )
            channels["lora/tensor, 5 requests"].one_request = False
            seconds: dict[str, list[float]] = {name: [] for name in channels}
            ratios, parts = [], Phases()
            for _ in range(args.rounds):  # every row in each round: rounds see the same load, ratios are per round
                for name, channel in channels.items():
                    export = engine.export_hf_weights if name.startswith("full") else engine.export_adapter
                    each = parts.record if name == "lora/tensor" else None
                    seconds[name] += (got := timed_updates(channel, export, args.repeats, version, each))
                    if name == f"full/{args.transports[0]}":
                        full_round = min(got)
                    elif name == "lora/tensor":
                        ratios.append(full_round / min(got))
                parts.time_export(engine.export_adapter, args.repeats)
            lora = min(seconds["lora/tensor"])
            print(f"{'update':<26}{'MB moved':>9}{'best s':>9}{'median s':>10}{'full / lora':>13}")
            for name, channel in channels.items():
                nbytes = full_bytes if name.startswith("full") else channel.bytes_sent
                best, median = best_and_median(seconds[name])
                mark = ("  goal met" if best / lora >= GOAL else f"  goal >= {GOAL:g}x") if name[:4] == "full" else ""
                print(f"{name:<26}{nbytes / 1e6:>9.2f}{best:>9.4f}{median:>10.4f}{best / lora:>12.1f}x{mark}")
            print(f"full/{args.transports[0]} / lora/tensor, best of each round: "
                  + ", ".join(f"{r:.1f}x" for r in ratios))  # fmt: skip
            media = {medium: channels[f"lora/{medium}"] for medium in ("tensor", "disk")}
            print("lora/tensor update by phase, all rounds (ms)  best  median")
            print("\n".join(parts.table()))
            bare, empty = floors(url, args.repeats)
            print(f"floors (best ms): one request that does no work {bare * 1e3:.2f}; a swap of no adapter (pause and "
                  f"continue) {empty * 1e3:.2f}")  # fmt: skip
            print(f"lora bytes moved: the shared buffer in SGLang's stacked layout (q/k/v and gate/up A once: "
                  f"{media['tensor'].bytes_sent} B) or the PEFT directory ({media['disk'].bytes_sent} B); full: the "
                  f"exported HF tensors ({full_bytes} B)")  # fmt: skip
            probe = probe_tokens(engine.bridge.hf_config.vocab_size)
            served = served_logprobs(url, probe, lora_path=client.LORA_ADAPTER_NAME)
            worst = float((served - trainer_logprobs(engine, probe)).abs().max())
            moved = float((served - served_logprobs(url, probe)).abs().max())
            print(f"check: served under the adapter vs trainer {worst:.2g}; adapter vs base {moved:.2g}")
            print(f"load average {load_average()} after")
            for channel in channels.values():
                channel.close()
        finally:
            server.stop()
            destroy_parallel()


if __name__ == "__main__":
    main()
