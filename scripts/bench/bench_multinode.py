"""Benchmark of a job placed across nodes: prints figures, asserts nothing.

    .venv/bin/python scripts/bench/bench_multinode.py              # ~5 min on 2 cores
    .venv/bin/python scripts/bench/bench_multinode.py --num-rollout 10

The same job runs twice in one run: on a simulated 3-node cluster (tools/simulated_cluster.py: real raylets on this
machine, trainer ranks on one node, one engine on each of two others) and on one node (a local Ray instance).
Disaggregated, DP=2 trainer, two SGLang engines, distributed weight update, the demo's tiny Qwen3 and addition
prompts. Figures: start-up (process start to the first step's start, and the run's own `time/startup`: Ray,
placement, engines, trainer ranks) and step time (median `time/step`, first step skipped), each as the ratio
cluster / one node. Goals: step time <= 1.10x, start-up <= 1.5x. Both jobs share these 2 cores, so only the
ratios mean something.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tools.simulated_cluster import RAY_ENV, start_cluster  # noqa: E402

GOALS = {"step": 1.10, "startup": 1.5}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the benchmark."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-rollout", type=int, default=6)
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs of every process)")
    return p.parse_args(argv)


def make_task(work: Path) -> tuple[Path, Path]:
    """The demo's tiny model and addition prompts."""
    from tools.make_demo_data import make_demo_data
    from tools.make_tiny_model import make_tiny_model
    from tools.make_tiny_model import parse_args as model_args

    model = make_tiny_model(model_args(["--out", str(work / "model"), "--family", "qwen3"]))
    return model, make_demo_data(work / "data") / "train.jsonl"


def run_job(model: Path, data: Path, out: Path, num_rollout: int, ray_address: str | None) -> dict[str, float]:
    """One job; its start-up and step figures."""
    cmd = [
        sys.executable, "-m", "slime_like.train", "--hf-checkpoint", str(model), "--prompt-data", str(data),
        "--input-key", "prompt", "--label-key", "label", "--rollout-shuffle",
        "--rollout-batch-size", "8", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "8",
        "--num-rollout", str(num_rollout), "--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "2",
        "--update-weight-transport", "distributed", "--lr", "1e-3", "--output-dir", str(out), "--ray-num-cpus", "4",
    ]  # fmt: skip
    env = {**os.environ, **RAY_ENV, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    if ray_address:
        env["RAY_ADDRESS"] = ray_address
    start = time.monotonic()
    with open(out.with_suffix(".log"), "w") as log:
        proc = subprocess.run(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, timeout=1800)
    if proc.returncode:
        raise SystemExit(f"the job failed; its output: {out.with_suffix('.log')}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["time/step"] for r in records if "time/step" in r]
    wall = time.monotonic() - start
    return {
        "startup": records[0]["time/startup"],
        "to_first_step": wall - sum(steps) - records[-1].get("eval/time", 0.0),
        "step": statistics.median(steps[1:]),
    }


def main(argv: list[str] | None = None) -> None:
    """Run the job on the simulated cluster, then on one node; print the figures and ratios."""
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench_multinode_"))
    model, data = make_task(work)
    cluster, _ = start_cluster([2, 1, 1])
    try:
        on_cluster = run_job(model, data, work / "cluster", args.num_rollout, cluster.address)
    finally:
        cluster.shutdown()
    on_one_node = run_job(model, data, work / "single", args.num_rollout, None)
    print(f"\n{'figure':<34}{'3 nodes':>10}{'1 node':>10}{'ratio':>8}{'goal':>8}")
    rows = [
        ("step time, median (s)", "step", GOALS["step"]),
        ("start-up: time/startup (s)", "startup", GOALS["startup"]),
        ("start-up: launch to first step (s)", "to_first_step", GOALS["startup"]),
    ]
    for label, key, goal in rows:
        ratio = on_cluster[key] / on_one_node[key]
        verdict = "PASS" if ratio <= goal else "MISS"
        print(
            f"{label:<34}{on_cluster[key]:>10.2f}{on_one_node[key]:>10.2f}{ratio:>8.2f}{'<=' + str(goal):>8} {verdict}"
        )
    print(f"\nwork directory: {work}" + ("" if args.keep else " (removed)"))
    if not args.keep:
        import shutil

        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
