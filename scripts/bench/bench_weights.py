"""Benchmark of the weight-update transports: prints figures, asserts nothing.

    .venv/bin/python scripts/bench/bench_weights.py                    # ~400 MB of fp32 weights, 1 and 2 servers
    .venv/bin/python scripts/bench/bench_weights.py --num-layers 4 --repeats 2

A Qwen3 made by tools/make_tiny_model.py with larger sizes is loaded into a one-rank Megatron engine; each
transport (distributed, tensor, disk) updates one, then two fp32 SGLang servers, the whole protocol timed
(pause, flush, send, version, continue). Next to it, in the same run, a plain copy of the same bytes: every
exported tensor copied once into a preallocated buffer (the least any in-place update must do). Reported,
best of --repeats: the whole update's seconds and its ratio to the plain copy (goal on CPU: <= 2x for
distributed and tensor), then the data path alone (the transport's send: no pause, flush, version or
continue), its GB/s summed over servers, and its ratio. On CPU SGLang's /flush_cache runs a full gc.collect()
in the server, a few ms since SGLangServer freezes the start-up heap (/freeze_gc); the whole update includes it.

Two more baselines price the medium each transport rides on, with plain processes in place of servers:
"bare gloo" broadcasts the same bytes from this process to N receivers (distributed's medium), and "bare
shm" hands N receivers the same tensors through shared-memory handles, each mapping them afresh and copying
them into its own buffers, as a server does every update (tensor's medium). The last column is the send's
ratio to its medium.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GOAL = 2.0  # transport time / plain copy time, for distributed and tensor


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The ~400 MB model's shape (make_model) and the update bucket, shared with bench_lora_update.py."""
    p.add_argument("--model", default=None, help="an HF directory to use instead of making one")
    p.add_argument("--hidden-size", type=int, default=1024)
    p.add_argument("--ffn-hidden-size", type=int, default=3072)
    p.add_argument("--num-layers", type=int, default=8)
    p.add_argument("--num-heads", type=int, default=16)
    p.add_argument("--num-kv-heads", type=int, default=8)
    p.add_argument("--bucket-mb", type=int, default=512, help="--update-weight-buffer-size in MiB")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the benchmark."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(p)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--transports", nargs="+", default=["distributed", "tensor", "disk"])
    p.add_argument("--servers", nargs="+", type=int, default=[1, 2], help="server counts to update")
    return p.parse_args(argv)


def make_model(args: argparse.Namespace, out: Path) -> Path:
    """The scaled-up tiny Qwen3 (random weights, the tiny tokenizer)."""
    from tools.make_tiny_model import make_tiny_model
    from tools.make_tiny_model import parse_args as tiny_args

    flags = ["--out", str(out), "--family", "qwen3", "--hidden-size", str(args.hidden_size),
             "--ffn-hidden-size", str(args.ffn_hidden_size), "--num-layers", str(args.num_layers),
             "--num-heads", str(args.num_heads), "--num-kv-heads", str(args.num_kv_heads), "--no-tie-word-embeddings"]  # fmt: skip
    return make_tiny_model(tiny_args(flags))


def plain_copy_seconds(engine, repeats: int) -> tuple[float, int]:
    """Best time to copy every exported tensor once into preallocated buffers, and the bytes copied."""
    import torch

    sources = [t for _, t in engine.export_hf_weights()]
    targets = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in sources]
    for target in targets:
        target.zero_()  # touch the pages: the transports reuse warm buffers too
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for target, source in zip(targets, sources, strict=True):
            target.copy_(source)
        best = min(best, time.perf_counter() - start)
    return best, sum(t.numel() * t.element_size() for t in sources)


_GLOO_RANK = """
import sys, time, torch, torch.distributed as dist
torch.set_num_threads(1)
rank, world, port, nbytes, repeats = map(int, sys.argv[1:])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
buf = torch.ones(nbytes, dtype=torch.uint8) if rank == 0 else torch.zeros(nbytes, dtype=torch.uint8)
best = float("inf")
for _ in range(repeats + 1):  # one warm-up
    dist.barrier()
    start = time.perf_counter()
    dist.broadcast(buf, 0)
    best = min(best, time.perf_counter() - start)
if rank == 0:
    print(best, flush=True)
dist.destroy_process_group()
"""

_SHM_RECEIVER = """
import base64, pickle, sys, torch, torch.multiprocessing
torch.multiprocessing.set_sharing_strategy("file_system")
torch.set_num_threads(1)
own = None
for line in sys.stdin:
    named = pickle.loads(base64.b64decode(line))  # maps the shared files, as a server does
    own = own or [torch.zeros_like(t) for _, t in named]
    for dst, (_, src) in zip(own, named):
        dst.copy_(src)
    del named  # a server drops them after loading: the next update maps them afresh
    print("ok", flush=True)
"""


def bare_gloo_seconds(nbytes: int, receivers: int, repeats: int) -> float:
    """Best time to broadcast nbytes over gloo from one plain process to `receivers` others."""
    import subprocess

    from slime_like.core.process import free_port

    port, world = free_port(), receivers + 1
    cmd = [sys.executable, "-c", _GLOO_RANK]
    args = [str(port), str(nbytes), str(repeats)]
    procs = [
        subprocess.Popen([*cmd, str(r), str(world), *args], stdout=subprocess.PIPE, text=True) for r in range(world)
    ]
    out = procs[0].communicate(timeout=600)[0]
    for proc in procs[1:]:
        proc.wait(timeout=60)
    return float(out.split()[-1])


def bare_shm_seconds(engine, receivers: int, repeats: int) -> float:
    """Best time for `receivers` plain processes to map the exported tensors' handles and copy them."""
    import subprocess

    from slime_like.trainer.weights.tensor import TensorTransport, serialize_tensors

    shareable = TensorTransport([], 1 << 30)._shareable  # the tensor transport's own choice of what to share
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _SHM_RECEIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for _ in range(receivers)
    ]
    best = float("inf")
    try:
        for i in range(repeats + 2):  # two warm-ups: sharing the parameters, then the staging copies
            named = shareable(list(engine.export_hf_weights()))
            start = time.perf_counter()
            for proc in procs:
                proc.stdin.write(serialize_tensors(named) + "\n")
                proc.stdin.flush()
            for proc in procs:
                proc.stdout.readline()
            if i >= 2:
                best = min(best, time.perf_counter() - start)
    finally:
        for proc in procs:
            proc.stdin.close()
            proc.wait(timeout=60)
    return best


def transport(kind: str, urls: list[str], bucket: int, model: Path, directory: Path):
    """A transport of `kind` for these servers."""
    from slime_like.trainer.weights.disk import DiskTransport
    from slime_like.trainer.weights.distributed import DistributedTransport
    from slime_like.trainer.weights.tensor import TensorTransport

    if kind == "distributed":
        return DistributedTransport(urls, bucket, timeout_s=600)
    if kind == "tensor":
        return TensorTransport(urls, bucket, timeout_s=600)
    return DiskTransport(urls, bucket, str(model), str(directory), timeout_s=600)


def time_updates(kind: str, urls: list[str], args, engine, model: Path, work: Path, version: list[int]):
    """Best of --repeats full updates and of --repeats bare sends (after a warm-up that connects and shares)."""
    channel = transport(kind, urls, args.bucket_mb * 1024**2, model, work / "disk")
    full = send = float("inf")
    try:
        for i in range(args.repeats + 1):
            version[0] += 1
            start = time.perf_counter()
            channel.update(engine.export_hf_weights(), version[0])
            if i:
                full = min(full, time.perf_counter() - start)
        for _ in range(args.repeats):  # the data path alone: no pause, flush, version tag or continue
            start = time.perf_counter()
            channel.send(engine.export_hf_weights(), version[0])
            send = min(send, time.perf_counter() - start)
    finally:
        channel.close()
    return full, send


def main(argv: list[str] | None = None) -> None:
    """Make the model, start the servers, time the plain copy and each transport, print the table."""
    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.path.insert(0, str(REPO))
    import torch

    from rollout.sglang_server import SGLangServer
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.parallel import destroy_parallel, init_parallel

    with tempfile.TemporaryDirectory(prefix="bench_weights_") as tmp:
        work = Path(tmp)
        model = Path(args.model) if args.model else make_model(args, work / "model")
        init_parallel()
        engine = MegatronTrainEngine(model, optimizer=None)
        copy_s, nbytes = plain_copy_seconds(engine, args.repeats)
        gb = nbytes / 1e9
        print(f"model: {model} ({gb * 1000:.0f} MB of {next(engine.model[0].parameters()).dtype} weights), "
              f"bucket {args.bucket_mb} MiB, best of {args.repeats}, {torch.get_num_threads()} torch thread(s)")  # fmt: skip
        head = f"{'transport':<12}{'servers':>8}{'update s':>10}{'x copy':>8}{'send s':>9}{'GB/s':>7}{'x copy':>8}"
        print(head + f"{'x medium':>10}")
        print(f"{'plain copy':<12}{'-':>8}{copy_s:>10.3f}{1.0:>8.2f}{copy_s:>9.3f}{gb / copy_s:>7.2f}{1.0:>8.2f}")
        medium = {}
        for count in args.servers:
            medium["distributed", count] = bare_gloo_seconds(nbytes, count, args.repeats)
            medium["tensor", count] = bare_shm_seconds(engine, count, args.repeats)
            for kind in ("distributed", "tensor"):
                name = {"distributed": "bare gloo", "tensor": "bare shm"}[kind]
                t = medium[kind, count]
                print(f"{name:<12}{count:>8}{'-':>10}{'-':>8}{t:>9.3f}{gb * count / t:>7.2f}{t / copy_s:>8.1f}")
        servers = [SGLangServer(model, dtype="float32", log_dir=work / "logs", startup_timeout=600)
                   for _ in range(max(args.servers))]  # fmt: skip
        version = [0]
        try:
            for server in servers:
                server.start(wait=False)
            for server in servers:
                server.wait_ready()
            for count in args.servers:
                urls = [s.url for s in servers[:count]]
                for kind in args.transports:
                    full, send = time_updates(kind, urls, args, engine, model, work, version)
                    ratio = full / copy_s
                    to_medium = f"{send / medium[kind, count]:>10.2f}" if (kind, count) in medium else f"{'-':>10}"
                    mark = "" if kind == "disk" else ("  goal met" if ratio <= GOAL else f"  goal <= {GOAL:g}x")
                    print(f"{kind:<12}{count:>8}{full:>10.3f}{ratio:>8.1f}{send:>9.3f}{gb * count / send:>7.2f}"
                          f"{send / copy_s:>8.1f}{to_medium}{mark}", flush=True)  # fmt: skip
        finally:
            for server in servers:
                server.stop()
            destroy_parallel()


if __name__ == "__main__":
    main()
