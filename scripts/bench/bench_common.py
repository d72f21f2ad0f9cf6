"""What the benchmarks share: the repository, the tag that finds their processes, the tiny model and demo data,
the demo job's flags, and running, timing and cleaning up subprocesses."""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TAG = "SLIME_BENCH_TAG"  # set in every process a benchmark starts, to find leftovers by it


def median(values: list[float]) -> float:
    """Median, NaN for no values."""
    return statistics.median(values) if values else float("nan")


def run_logged(cmd: list[str], log: Path, timeout: float = 600) -> list[tuple[float, str]]:
    """Run a command from the repo root; its output goes to `log`; returns (seconds since start, line) pairs."""
    log.parent.mkdir(parents=True, exist_ok=True)
    lines: list[tuple[float, str]] = []
    start = time.monotonic()
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.monotonic() - start, line.rstrip("\n")))
            f.write(line)
            if time.monotonic() - start > timeout:
                proc.kill()
                break
        proc.wait()
    if proc.returncode != 0:
        tail = "\n".join(text for _, text in lines[-40:])
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {proc.returncode}; log {log}:\n{tail}")
    return lines


def tagged_processes(tag: str) -> list[Any]:
    """Live processes (other than this one) that carry this benchmark's tag in their environment."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(TAG) == tag and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def kill_leftovers(tag: str, where: str, grace: float = 0.0) -> None:
    """Stop, by pid, every process this benchmark started that outlived `where` (after `grace` seconds)."""
    import psutil

    deadline = time.monotonic() + grace
    procs = tagged_processes(tag)
    while procs and time.monotonic() < deadline:
        time.sleep(0.5)
        procs = tagged_processes(tag)
    if not procs:
        return
    names = []
    for p in procs:
        try:
            names.append(f"{p.name()}({p.pid})")
        except psutil.Error:
            pass
    print(f"  [cleanup] {len(procs)} process(es) outlived {where} by {grace:.0f}s: {', '.join(names)}", flush=True)
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=10)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)


def prepare(work: Path, sft_steps: int = 0) -> Path:
    """The tiny model (as in the demo) and the addition data under `work`, and the model to run: the tiny one, or its
    SFT warm start after `sft_steps` steps (each kept when already there)."""
    py = sys.executable
    base, data = work / "base", work / "data"
    if not (base / "config.json").exists():
        run_logged(
            [py, "tools/make_tiny_model.py", "--out", str(base), "--hidden-size", "128", "--ffn-hidden-size", "256",
             "--num-layers", "4", "--num-heads", "4", "--num-kv-heads", "2"],
            work / "logs" / "make_tiny_model.log",
        )  # fmt: skip
    if not (data / "train.jsonl").exists():
        run_logged(
            [py, "tools/make_demo_data.py", "--out", str(data), "--max-operand", "9"], work / "logs" / "data.log"
        )
    if sft_steps <= 0:
        return base
    sft = work / f"sft{sft_steps}"
    if not (sft / "model.safetensors").exists():
        run_logged(
            [py, "tools/sft_warmstart.py", "--hf-checkpoint", str(base), "--data", str(data / "sft.jsonl"),
             "--out", str(sft), "--steps", str(sft_steps)],
            work / "logs" / "sft.log",
        )  # fmt: skip
    return sft


def job_flags(model: Path, work: Path, args: argparse.Namespace, max_response_len: int) -> list[str]:
    """The run's flags, shared by the loop subprocesses and the in-process sections."""
    return [
        "--hf-checkpoint", str(model), "--prompt-data", str(work / "data" / "train.jsonl"), "--rollout-shuffle",
        "--input-key", "prompt", "--label-key", "label",
        "--rollout-batch-size", str(args.rollout_batch_size), "--n-samples-per-prompt", str(args.n_samples_per_prompt),
        "--num-rollout", str(args.num_rollout), "--rollout-max-response-len", str(max_response_len),
        "--rollout-stop-token-ids", "2", "--rollout-num-gpus", str(args.num_servers), "--rm-type", "math",
        "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1", "--max-tokens-per-gpu", str(args.max_tokens_per_gpu),
        "--advantage-estimator", "grpo", "--eps-clip", "0.2", "--lr", "3e-4", "--clip-grad", "1.0",
        "--ray-num-cpus", "4", "--output-dir", str(work / "runs" / "inproc"),
    ]  # fmt: skip


def prompt_rows(work: Path, n: int) -> list[dict[str, str]]:
    """The first n training prompts of the demo data (cycled if there are fewer)."""
    rows = [json.loads(line) for line in (work / "data" / "train.jsonl").read_text().splitlines() if line.strip()]
    return [rows[i % len(rows)] for i in range(n)]
