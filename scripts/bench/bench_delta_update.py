"""Benchmark: delta weight sync vs a full disk update, bytes written and seconds; prints figures, asserts nothing.

    .venv/bin/python scripts/bench/bench_delta_update.py                  # SmolLM2-135M (fp32, ~540 MB), lr 3e-4
    .venv/bin/python scripts/bench/bench_delta_update.py --dtype bfloat16 # the same in bf16 (~270 MB)
    .venv/bin/python scripts/bench/bench_delta_update.py --model DIR --lr 1e-6

The model is SmolLM2-135M-Instruct (tools/convert_smollm2.py, safetensors in --dtype) unless --model names an HF
directory (stored in --dtype). A one-rank Megatron engine at that precision (bf16: bf16 weights with fp32 main
weights in the optimizer, as a bf16 run trains) takes one real optimizer step (Adam, --lr: the CPU demo's 3e-4 by
default) on a fixed sequence; one SGLang server serves the model at the same precision. Each row moves the server
from the checkpoint's weights to the stepped ones:
- full disk: weights/disk.py writes the whole HF checkpoint and the server reloads it;
- delta xor / delta overwrite: weights/delta.py diffs against the snapshot and writes only compressed deltas, the
  host-local checkpoint is patched (rollout/delta_pull.py, in this process: one host), the server reloads it.
Columns: bytes written to the shared directory, the whole update's seconds, and for deltas its parts (publish:
diff + compress + checksum + write; apply on the host; pause + reload + continue). The last lines print the ratios
delta / full. The served log-probs are compared with the trainer's after each row, and each delta row's with the full
row's (the same weights: equal, also in bf16, where the server and the trainer differ by more than in fp32).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
SEQUENCE = [1, 504, 3458, 314, 253, 5356, 30, 198, 504, 3458, 314, 253, 1165, 338, 4250, 30]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the benchmark."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="an HF safetensors directory (default: SmolLM2-135M, converted)")
    p.add_argument("--lr", type=float, default=3e-4, help="the optimizer step's learning rate (the CPU demo's)")
    p.add_argument("--bucket-mb", type=int, default=512, help="--update-weight-buffer-size in MiB")
    p.add_argument("--keep", action="store_true", help="keep the work directory (converted model, versions, logs)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="checkpoint, trainer, server")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Convert the model, step it once, time a full disk update and both delta encodings, print the table."""
    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    from rollout import delta_pull
    from rollout.sglang_server import SGLangServer
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.optimizer import OptimizerSettings
    from slime_like.trainer.megatron.parallel import init_parallel
    from slime_like.trainer.weights.check import served_logprobs
    from slime_like.trainer.weights.delta import DeltaDiskTransport
    from slime_like.trainer.weights.disk import DiskTransport

    work = Path(tempfile.mkdtemp(prefix="bench_delta_"))
    if args.model:
        model = Path(args.model)
    else:
        from tools.convert_smollm2 import convert, shipped_gguf

        model = convert(shipped_gguf(), work / "smollm2", args.dtype)
    bucket = args.bucket_mb * 1024**2
    init_parallel(tp=1, pp=1, seed=1234)
    optimizer = OptimizerSettings(lr=args.lr, use_distributed_optimizer=False)
    engine = MegatronTrainEngine(model, optimizer, dtype=getattr(torch, args.dtype))
    rows: list[tuple[str, int, float, str]] = []
    load_before = os.getloadavg()[0]
    with SGLangServer(model, dtype=args.dtype, log_dir=work / "logs", startup_timeout=900) as server:
        urls = [server.url]
        before = {name: tensor.clone() for name, tensor in engine.export_hf_weights()}
        engine.train_step([torch.tensor(SEQUENCE)], [None], lambda lps, data: -lps[0].mean())
        moved = sum(int((t != before[n]).sum()) for n, t in engine.export_hf_weights())
        print(f"the step changed {moved / sum(t.numel() for t in before.values()):.1%} of the {args.dtype} values",
              flush=True)  # fmt: skip
        del before
        expected = engine.forward_logprobs([SEQUENCE])[0]
        model_bytes = sum(t.numel() * t.element_size() for _, t in engine.export_hf_weights())
        version = 0
        local = work / "nvme"
        served: dict[str, torch.Tensor] = {}

        def pull(v: int, chain: str) -> list[dict]:  # one host, in this process (an engine actor runs the same)
            return [delta_pull.pull(local, model, work / "shared", v, chain)]

        for encoding in ("xor", "overwrite"):
            channel = DeltaDiskTransport(
                urls, bucket, hf_checkpoint=str(model), disk_dir=str(work / "shared"), local_dir=str(local),
                encoding=encoding, pull=pull, timeout_s=900,
            )  # fmt: skip
            channel.connect()  # start-up, not timed: the host copies the base, the trainer reads the snapshot
            version += 1
            start = time.perf_counter()
            channel.update(engine.export_hf_weights(), version)
            seconds = time.perf_counter() - start
            s = channel.stats
            parts = f"publish {s['publish_s']:.2f} s, apply {s['pull_s']:.2f} s, reload {s['reload_s']:.2f} s"
            rows.append((f"delta {encoding}", int(s["written_bytes"]), seconds, parts))
            served[encoding] = served_logprobs(server.url, SEQUENCE)
            drift = float((served[encoding] - expected).abs().max())
            print(f"delta {encoding}: served log-probs within {drift:.1e} of the trainer's", flush=True)
            channel.close()  # the next row's connect resets the host copy and the snapshot to the checkpoint
        full = DiskTransport(urls, bucket, str(model), str(work / "full"), timeout_s=900)
        version += 1
        start = time.perf_counter()
        full.update(engine.export_hf_weights(), version)
        seconds = time.perf_counter() - start
        written = sum(p.stat().st_size for p in (work / "full" / f"v{version}").iterdir())
        rows.insert(0, ("full disk", written, seconds, "write the checkpoint + pause + reload + continue"))
        full_served = served_logprobs(server.url, SEQUENCE)
        drift = float((full_served - expected).abs().max())
        print(f"full disk: served log-probs within {drift:.1e} of the trainer's", flush=True)
        for encoding, logprobs in served.items():  # the same weights: the same log-probs, at any precision
            gap = float((logprobs - full_served).abs().max())
            print(f"delta {encoding} vs full disk: served log-probs differ by {gap:.1e}")
    print(f"\nmodel {model.name}: {model_bytes / 1e6:.1f} MB of HF tensors in {args.dtype}; one Adam step at lr "
          f"{args.lr:g}; load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")  # fmt: skip
    print(f"{'update':<18} {'written MB':>11} {'seconds':>8}  parts")
    for name, written, seconds, parts in rows:
        print(f"{name:<18} {written / 1e6:>11.1f} {seconds:>8.2f}  {parts}")
    _, full_bytes, full_s, _ = rows[0]
    for name, written, seconds, _ in rows[1:]:
        print(f"{name} / full disk: bytes {written / full_bytes:.3f}, seconds {seconds / full_s:.3f}")
    if args.keep:
        print(f"(work dir {work})")
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
