"""Benchmark of fully asynchronous RL on a long-tail workload: prints figures and a PASS/FAIL line, asserts nothing.

    .venv/bin/python scripts/bench/bench_fully_async.py                   # the three loops, ~8 min on 2 cores
    .venv/bin/python scripts/bench/bench_fully_async.py --modes sync one-step --num-rollout 6
    .venv/bin/python scripts/bench/bench_fully_async.py --modes one-step fully --variant 'w24=--max-inflight-groups 24'

The same job runs three ways, one after another, each with one SGLang engine and one trainer rank on separate
devices (disaggregated): `slime_like.train` (sync), `slime_like.train_async` (one step ahead) and
`slime_like.train_async --fully-async`. The job is the CPU demo's task (scripts/run-tiny-cpu.sh: the tiny Qwen3
after its SFT warm start, single-digit addition, GRPO with 32 prompts x 8 samples) with a long tail made
deterministic by plugins/long_tail_generate.py: every sample generates exactly --response-len tokens, and every
--long-every-th training prompt --long-factor times as many (ignore_eos; the reward and the loss see the answer up
to its first stop token). Figures and goals: scripts/bench/README.md.

The loops run one after another, so on a shared machine each gets whatever CPU the other processes leave it: beside
the wall-clock figures it prints, over the same steps, the load average, the cores the run's processes got and their
CPU seconds per trained token by role (/proc), which do not depend on that share.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import REPO, TAG, kill_leftovers, median, prepare, run_logged, tagged_processes  # noqa: E402

MODES = {  # name -> the entry point's module and extra flags
    "sync": ("slime_like.train", []),
    "one-step": ("slime_like.train_async", []),
    "fully": ("slime_like.train_async", ["--fully-async"]),
}
GOAL_VS_SYNC, GOAL_VS_ONE_STEP = 2.0, 1.3  # fully async trained tokens/s over sync and over one-step async


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the benchmark."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES), help="loops to run, in order")
    p.add_argument("--num-rollout", type=int, default=20, help="training steps per loop")
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the throughput figures")
    p.add_argument(
        "--response-len", type=int, default=16, help="tokens of a short response (--rollout-max-response-len)"
    )
    p.add_argument("--long-factor", type=int, default=8, help="a long response is this many times longer")
    p.add_argument("--long-every", type=int, default=10, help="one training prompt in this many is long")
    p.add_argument("--rollout-batch-size", type=int, default=32)
    p.add_argument("--n-samples-per-prompt", type=int, default=8)
    p.add_argument("--max-tokens-per-gpu", type=int, default=512)
    p.add_argument(
        "--max-weight-staleness", type=int, default=2, help="fully async only; -1: unbounded (docs/fully-async.md)"
    )
    p.add_argument(
        "--max-inflight-groups",
        type=int,
        default=12,
        help="fully async only: 12 groups (96 requests) decode a long response within 2 steps; 0: the loop's default",
    )
    p.add_argument(
        "--pause-generation-mode", default="abort", choices=("abort", "retract", "in_place"), help="fully async only"
    )
    p.add_argument(
        "--job-flags",
        default="--use-tis",
        help="more training flags for all three loops (pass as --job-flags='...'); the default corrects stale "
        "samples (without it one step of staleness stopped the learning: scripts/bench/README.md)",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=FLAGS",
        help="also run the fully async loop as mode fully-NAME with these flags after the fully async ones (they "
        "win), e.g. --variant 'w16=--max-inflight-groups 16'; repeatable; run after --modes",
    )
    p.add_argument("--sft-steps", type=int, default=60, help="SFT warm start steps, as the demo")
    p.add_argument("--mode-timeout", type=float, default=1200, help="seconds one loop may run")
    p.add_argument("--work-dir", default=None, help="model, data, runs and logs (default: a temp dir, removed)")
    p.add_argument("--keep", action="store_true", help="keep the temp work dir (every process's log)")
    return p.parse_args(argv)


def long_tail_data(work: Path, every: int, factor: int) -> tuple[Path, int, int]:
    """The demo's training prompts with every `every`-th row marked long; returns (path, long rows, rows)."""
    rows = [json.loads(line) for line in (work / "data" / "train.jsonl").read_text().splitlines() if line.strip()]
    for i, row in enumerate(rows):
        row["metadata"] = {"response_len_factor": factor if i % every == 0 else 1}
    path = work / "data" / "train_long_tail.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (work / "data" / "all.jsonl").write_text(
        (work / "data" / "train.jsonl").read_text() + (work / "data" / "eval.jsonl").read_text()
    )
    return path, sum(i % every == 0 for i in range(len(rows))), len(rows)


def variants(a: argparse.Namespace) -> list[tuple[str, str]]:
    """(mode name, flags) of each --variant."""
    out = []
    for spec in a.variant:
        name, sep, flags = spec.partition("=")
        if not sep or not name:
            raise SystemExit(f"--variant {spec!r}: expected NAME=FLAGS")
        out.append((f"fully-{name}", flags))
    return out


def job_flags(model: Path, work: Path, a: argparse.Namespace, train_data: Path, out: Path) -> list[str]:
    """The flags every mode shares (the demo's, with the long-tail generate function)."""
    return [
        "--hf-checkpoint", str(model), "--prompt-data", str(train_data), "--input-key", "prompt",
        "--label-key", "label", "--rollout-shuffle",
        "--rollout-batch-size", str(a.rollout_batch_size), "--n-samples-per-prompt", str(a.n_samples_per_prompt),
        "--num-rollout", str(a.num_rollout), "--rollout-temperature", "1.0",
        "--rollout-max-response-len", str(a.response_len), "--rollout-stop-token-ids", "2",
        "--custom-generate-function-path", "plugins.long_tail_generate.generate",
        "--rollout-num-gpus", "1", "--rm-type", "math",
        # Greedy eval on all 100 problems before the first step and after the last (as the demo, stopping at EOS).
        "--eval-prompt-data", str(work / "data" / "all.jsonl"), "--eval-interval", str(a.num_rollout),
        "--eval-temperature", "0",
        "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1", "--max-tokens-per-gpu", str(a.max_tokens_per_gpu),
        "--advantage-estimator", "grpo", "--eps-clip", "0.2", "--lr", "3e-4", "--clip-grad", "1.0",
        "--ray-num-cpus", "4", "--output-dir", str(out), *shlex.split(a.job_flags),
    ]  # fmt: skip


def cpu_jiffies() -> tuple[float, float]:
    """(busy, total) CPU time of all cores since boot, from /proc/stat."""
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4], sum(fields)  # idle and iowait are not busy


# The run's processes by role (first match of the process title or command line), for CPU seconds per role.
ROLES = (
    ("engine scheduler", "sglang::scheduler"),
    ("engine detokenizer", "sglang::detokenizer"),
    ("engine HTTP + tokenizer", "launch_server"),
    ("router", "sglang::router"),
    ("router", "sglang_router"),
    ("rollout manager", "RolloutManager"),
    ("trainer", "TrainActor"),
    ("driver", "slime_like.train"),
)


def role_cpu(tag: str) -> dict[tuple[int, float], tuple[str, float]]:
    """(pid, start time) -> (role, user + system CPU seconds) of every live process of this benchmark's run."""
    import psutil

    out = {}
    for proc in tagged_processes(tag):
        try:
            with proc.oneshot():
                title = " ".join(proc.cmdline()) or proc.name()
                times = proc.cpu_times()
                key = (proc.pid, proc.create_time())
        except psutil.Error:
            continue
        role = next((name for name, pattern in ROLES if pattern in title), "Ray and other")
        out[key] = (role, times.user + times.system)
    return out


class CpuWatch(threading.Thread):
    """How busy the machine's cores are over the measured steps, and the CPU seconds of this run's processes by
    role: from the end of step `first - 1` (its record in metrics.jsonl) to the end of step `last`, polled every
    0.2 s. CPU seconds per token do not depend on what else runs on the machine the way wall time does."""

    def __init__(self, metrics: Path, first: int, last: int, tag: str) -> None:
        super().__init__(daemon=True)
        self.metrics, self.first, self.last, self.tag = metrics, first, last, tag
        self.marks: dict[int, tuple[float, float]] = {}
        self.roles: dict[int, dict[tuple[int, float], tuple[str, float]]] = {}
        self.clock: dict[int, float] = {}
        self.loads: list[float] = []  # the 1-minute load average, sampled over the measured steps
        self.done = threading.Event()

    def mark(self, step: int) -> None:
        self.marks[step] = cpu_jiffies()
        self.roles[step] = role_cpu(self.tag)
        self.clock[step] = time.monotonic()

    def run(self) -> None:
        if self.first == 0:
            self.mark(-1)
        while not self.done.wait(0.2) and self.last not in self.marks:
            if self.first - 1 in self.marks:
                self.loads.append(os.getloadavg()[0])
            lines = self.metrics.read_text().splitlines() if self.metrics.exists() else []
            steps = {json.loads(line)["step"] for line in lines if '"time/step"' in line}
            for step in sorted({self.first - 1, self.last} & steps - set(self.marks)):
                self.mark(step)

    def busy(self) -> float:
        """Fraction of all cores' time spent busy over the measured steps (nan if not seen)."""
        if self.first - 1 not in self.marks or self.last not in self.marks:
            return math.nan
        (b0, t0), (b1, t1) = self.marks[self.first - 1], self.marks[self.last]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else math.nan

    def load(self) -> float:
        """Mean 1-minute load average over the measured steps (this run's own busy processes included)."""
        return sum(self.loads) / len(self.loads) if self.loads else math.nan

    def cores(self) -> float:
        """CPU seconds of the run's processes per second of the measured steps: the cores the run got."""
        if self.first - 1 not in self.clock or self.last not in self.clock:
            return math.nan
        return sum(self.by_role().values()) / (self.clock[self.last] - self.clock[self.first - 1])

    def by_role(self) -> dict[str, float]:
        """CPU seconds of the run's processes over the measured steps, by role (empty if not seen)."""
        if self.first - 1 not in self.roles or self.last not in self.roles:
            return {}
        before, after = self.roles[self.first - 1], self.roles[self.last]
        seconds: dict[str, float] = {}
        for key, (role, cpu) in after.items():
            seconds[role] = seconds.get(role, 0.0) + cpu - before.get(key, (role, 0.0))[1]
        return seconds


def run_mode(name: str, model: Path, work: Path, a: argparse.Namespace, data: Path, tag: str) -> dict[str, Any]:
    """Run one loop as a subprocess; its step records, final records and wall time."""
    module, extra = MODES[name.split("-", 1)[0] if name.startswith("fully") else name]
    if name.startswith("fully"):
        extra = [*extra, "--pause-generation-mode", a.pause_generation_mode]
        if a.max_inflight_groups:
            extra += ["--max-inflight-groups", str(a.max_inflight_groups)]
        if a.max_weight_staleness >= 0:
            extra += ["--max-weight-staleness", str(a.max_weight_staleness)]
        extra += shlex.split(dict(variants(a)).get(name, ""))
    out = work / "runs" / name
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", module, *job_flags(model, work, a, data, out), *extra]
    print(f"\n== {name}: python -m {module} {' '.join(extra)} ==", flush=True)
    start = time.monotonic()
    watch = CpuWatch(out / "metrics.jsonl", a.warmup, a.num_rollout - 1, tag)
    watch.start()
    try:
        run_logged(cmd, work / "logs" / f"{name}.log", a.mode_timeout)
    finally:
        watch.done.set()
        kill_leftovers(tag, module, grace=10)
    wall = time.monotonic() - start
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    print(f"  done in {wall:.0f}s (log {work / 'logs' / f'{name}.log'})", flush=True)
    return {
        "records": records,
        "wall": wall,
        "cpu_busy": watch.busy(),
        "cpu_roles": watch.by_role(),
        "cores": watch.cores(),
        "load": watch.load(),
    }


def trained_tokens(r: dict[str, Any]) -> float:
    """Response tokens of the step's trained samples (the loops without the metric train every sample they get)."""
    if "rollout/trained_tokens" in r:
        return r["rollout/trained_tokens"]
    untrained = r.get("rollout/failed_rate", 0.0) + r.get("rollout/aborted_rate", 0.0)
    return r["rollout/generated_tokens"] * (1.0 - untrained)


def generated_tokens(r: dict[str, Any]) -> float:
    """Response tokens the engines produced in the step (fully async: also those of groups not trained yet, thrown
    away, or aborted and continued; the other loops train what they generate)."""
    if "perf/tokens_generated_per_s" in r:
        return r["perf/tokens_generated_per_s"] * r["rollout/time"]
    return r["rollout/generated_tokens"]


def figures(name: str, run: dict[str, Any], a: argparse.Namespace) -> dict[str, float]:
    """Per-mode figures from metrics.jsonl over the measured steps (the first --warmup left out)."""
    records = run["records"]
    steps = [r for r in records if "time/step" in r and r["step"] < a.num_rollout]
    measured = [r for r in steps if r["step"] >= a.warmup]
    evals = [r for r in records if "eval/reward_mean" in r]
    seconds = sum(r["time/step"] for r in measured)
    busy_trainer = sum(r.get("time/logprob", 0) + r.get("time/train", 0) + r.get("time/update_weights", 0)
                       for r in measured)  # fmt: skip
    if name.startswith("fully"):  # the continuous rollout measures it: nothing generating (paused, or at the bound)
        engine_idle = sum(r["time/engine_idle"] for r in measured)
    else:  # nothing generates outside a rollout's generate call (one step ahead: between two rollouts)
        engine_idle = sum(max(0.0, r["time/step"] - r["rollout/time"]) for r in measured)
    f = {
        "steps": len(measured),
        "tokens_trained": sum(trained_tokens(r) for r in measured),
        "seconds": seconds,
        "trained_tok_s": sum(trained_tokens(r) for r in measured) / seconds if seconds else math.nan,
        "engine_idle_frac": engine_idle / seconds if seconds else math.nan,
        "trainer_idle_frac": 1.0 - busy_trainer / seconds if seconds else math.nan,
        "eval_first": evals[0]["eval/reward_mean"] if evals else math.nan,
        "eval_final": evals[-1]["eval/reward_mean"] if evals else math.nan,
        "eval_n": evals[-1].get("eval/all/num_samples", math.nan) if evals else math.nan,
        "wall": run["wall"],
        "cpu_busy": run["cpu_busy"],
        # Samples whose generation failed: a run with any did not do the same work as the others.
        "failed_samples": sum(r.get("rollout/failed_rate", 0) * r.get("rollout/num_samples", 0) for r in steps),
        "startup": steps[0].get("time/startup", math.nan) if steps else math.nan,
        "tokens_generated": sum(generated_tokens(r) for r in measured),
        "cpu_roles": run["cpu_roles"],
        "cores": run["cores"],
        "load": run["load"],
    }
    cpu = sum(run["cpu_roles"].values())
    f["tok_per_cpu_s"] = f["tokens_trained"] / cpu if cpu else math.nan
    for label, key in (("generate", "rollout/time"), ("logprob", "time/logprob"), ("train", "time/train"),
                       ("update", "time/update_weights"), ("step", "time/step"),
                       ("response_len", "rollout/response_len_mean"), ("reward", "rollout/reward_mean")):  # fmt: skip
        f[f"median_{label}"] = median([r[key] for r in measured if key in r])
    if name.startswith("fully"):
        f["perf_tok_s"] = median([r["perf/tokens_trained_per_s"] for r in measured if "perf/tokens_trained_per_s" in r])
        f["gen_tok_s"] = median(
            [r["perf/tokens_generated_per_s"] for r in measured if "perf/tokens_generated_per_s" in r]
        )
        f["trainer_wait"] = sum(r.get("time/trainer_idle", 0) for r in measured) / seconds if seconds else math.nan
        f["staleness_mean"] = median([r["rollout/staleness_mean"] for r in measured if "rollout/staleness_mean" in r])
        f["staleness_max"] = max((r.get("rollout/staleness_max", 0) for r in measured), default=math.nan)
        f["stale_regenerated"] = sum(r.get("rollout/groups_stale_regenerated", 0) for r in measured)
        f["samples_partial"] = sum(r.get("rollout/samples_partial", 0) for r in measured)
    else:
        f["gen_tok_s"] = median([r["rollout/tokens_per_s"] for r in measured if "rollout/tokens_per_s" in r])
    return f


def noise(p: float, q: float, n: float) -> float:
    """Two standard errors of the difference of two accuracies on the same n-problem eval set (binomial)."""
    pbar = (p + q) / 2
    return 2.0 * math.sqrt(max(pbar * (1 - pbar), 1e-9) * 2.0 / n)


def cpu_table(figs: dict[str, dict[str, float]]) -> None:
    """CPU seconds of each loop's processes over the measured steps, by role, per 1000 trained tokens."""
    roles = sorted({r for f in figs.values() for r in f["cpu_roles"]}, key=lambda r: [n for n, _ in ROLES].index(r)
                   if r in [n for n, _ in ROLES] else len(ROLES))  # fmt: skip
    if not roles:
        return
    print("\n== CPU seconds per 1000 trained tokens, by process role (the same steps) ==")
    print(f"  {'':<26}" + "".join(f"{n:>12}" for n in figs))
    per_k = {n: 1000.0 / f["tokens_trained"] if f["tokens_trained"] else math.nan for n, f in figs.items()}
    for role in roles:
        values = [f["cpu_roles"].get(role, 0.0) * per_k[n] for n, f in figs.items()]
        print(f"  {role:<26}" + "".join(f"{v:>12.3f}" for v in values))
    totals = [sum(f["cpu_roles"].values()) * per_k[n] for n, f in figs.items()]
    print(f"  {'all':<26}" + "".join(f"{v:>12.3f}" for v in totals))
    gen = [f["tokens_generated"] / f["tokens_trained"] if f["tokens_trained"] else math.nan for f in figs.values()]
    print(f"  {'generated / trained tokens':<26}" + "".join(f"{v:>12.2f}" for v in gen))
    sched = [f["cpu_roles"].get("engine scheduler", math.nan) / f["tokens_generated"] * 1000 if f["tokens_generated"]
             else math.nan for f in figs.values()]  # fmt: skip
    print(f"  {'scheduler s / 1k generated':<26}" + "".join(f"{v:>12.3f}" for v in sched))


def report(figs: dict[str, dict[str, float]], a: argparse.Namespace) -> None:
    """Print the per-mode table, the ratios and the PASS/FAIL line."""
    names = list(figs)
    rows = [
        ("trained tokens/s", "trained_tok_s", "{:.0f}"),
        ("  ratio to sync", "ratio_sync", "{:.2f}"),
        ("  ratio to one-step", "ratio_one_step", "{:.2f}"),
        ("engine idle fraction", "engine_idle_frac", "{:.2f}"),
        ("trainer idle fraction", "trainer_idle_frac", "{:.2f}"),
        ("machine CPU busy fraction", "cpu_busy", "{:.2f}"),
        ("  load average (1 min)", "load", "{:.1f}"),
        ("  cores the run got", "cores", "{:.2f}"),
        ("trained tokens / CPU s", "tok_per_cpu_s", "{:.0f}"),
        ("  ratio to one-step", "cpu_ratio_one_step", "{:.2f}"),
        ("eval reward, first", "eval_first", "{:.2f}"),
        ("eval reward, final", "eval_final", "{:.2f}"),
        ("wall time (s)", "wall", "{:.0f}"),
        ("  start-up (s)", "startup", "{:.0f}"),
        ("measured steps", "steps", "{:.0f}"),
        ("  their seconds", "seconds", "{:.1f}"),
        ("  tokens trained", "tokens_trained", "{:.0f}"),
        ("median step (s)", "median_step", "{:.2f}"),
        ("  generate (s)", "median_generate", "{:.2f}"),
        ("  log-prob (s)", "median_logprob", "{:.2f}"),
        ("  train (s)", "median_train", "{:.2f}"),
        ("  weight update (s)", "median_update", "{:.2f}"),
        ("median response len", "median_response_len", "{:.1f}"),
        ("median rollout reward", "median_reward", "{:.2f}"),
        ("generated tokens/s", "gen_tok_s", "{:.0f}"),
        ("failed samples", "failed_samples", "{:.0f}"),
    ]
    for base in ("sync", "one-step"):
        rate = figs.get(base, {}).get("trained_tok_s", math.nan)
        for f in figs.values():
            f[f"ratio_{base.replace('-', '_')}"] = f["trained_tok_s"] / rate
    per_cpu = figs.get("one-step", {}).get("tok_per_cpu_s", math.nan)
    for f in figs.values():
        f["cpu_ratio_one_step"] = f["tok_per_cpu_s"] / per_cpu
    print(f"\n== Figures (steps {a.warmup}..{a.num_rollout - 1}; eval before step 0 and after the last) ==")
    print(f"  {'':<26}" + "".join(f"{n:>12}" for n in names))
    for label, key, fmt in rows:
        values = [f[key] for f in figs.values()]
        print(f"  {label:<26}" + "".join(f"{fmt.format(v):>12}" for v in values))
    for name, f in figs.items():
        if not name.startswith("fully"):
            continue
        print(
            f"  {name}: perf/tokens_trained_per_s median {f['perf_tok_s']:.0f}, trainer waiting for its batch "
            f"{f['trainer_wait']:.2f} of the time, staleness median-of-means {f['staleness_mean']:.2f} (max "
            f"{f['staleness_max']:.0f}), {f['stale_regenerated']:.0f} groups regenerated as stale, "
            f"{f['samples_partial']:.0f} samples continued after an abort pause"
        )
    cpu_table(figs)
    if not {"sync", "one-step", "fully"} <= set(figs):
        print("\nPASS/FAIL: needs all three modes")
        return
    s, o, f = figs["sync"], figs["one-step"], figs["fully"]
    vs_sync, vs_one = f["trained_tok_s"] / s["trained_tok_s"], f["trained_tok_s"] / o["trained_tok_s"]
    band = noise(s["eval_final"], f["eval_final"], s["eval_n"])
    diff = f["eval_final"] - s["eval_final"]
    checks = [
        (f"fully/sync trained tokens/s {vs_sync:.2f} >= {GOAL_VS_SYNC}", vs_sync >= GOAL_VS_SYNC),
        (f"fully/one-step {vs_one:.2f} >= {GOAL_VS_ONE_STEP}", vs_one >= GOAL_VS_ONE_STEP),
        (f"final eval fully - sync {diff:+.2f} within noise +-{band:.2f}", abs(diff) <= band),
    ]
    print(
        f"\n  noise: two standard errors of the difference of two accuracies on {s['eval_n']:.0f} greedy eval "
        f"problems, 2*sqrt(p(1-p)*2/n) at p the mean of both (one run per mode: run-to-run spread not measured)"
    )
    verdict = "PASS" if all(ok for _, ok in checks) else "FAIL"
    failed = [n for n, fig in figs.items() if fig["failed_samples"]]
    if failed:  # generation errors (see the run's rollout.log): the modes did not do the same work
        verdict = f"INVALID (failed samples in {', '.join(failed)}), would be {verdict}"
    print(f"{verdict}: " + "; ".join(f"{text} [{'ok' if ok else 'miss'}]" for text, ok in checks))
    print(
        f"  per CPU second of the run's processes (whatever CPU share each loop got): fully/sync "
        f"{f['tok_per_cpu_s'] / s['tok_per_cpu_s']:.2f}, fully/one-step {f['tok_per_cpu_s'] / o['tok_per_cpu_s']:.2f}"
    )


def main(argv: list[str] | None = None) -> None:
    """Prepare the model and data, run the selected loops, print the figures."""
    a = parse_args(argv)
    tag = uuid.uuid4().hex
    os.environ.update({TAG: tag, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    os.environ.pop("RAY_ADDRESS", None)  # each loop starts (and stops) its own local Ray instance
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    temp = a.work_dir is None
    work = Path(a.work_dir or tempfile.mkdtemp(prefix="slime_bench_fa_")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"fully-async benchmark: {os.cpu_count()} CPU cores, load average {load}, work dir {work}", flush=True)
    try:
        model = prepare(work, a.sft_steps)
        data, n_long, n_rows = long_tail_data(work, a.long_every, a.long_factor)
        print(
            f"job: tiny Qwen3 after {a.sft_steps} SFT steps; {a.rollout_batch_size} prompts x {a.n_samples_per_prompt} "
            f"samples a step, {a.num_rollout} steps; responses exactly {a.response_len} tokens, {a.long_factor}x "
            f"({a.response_len * a.long_factor}) for {n_long} of the {n_rows} training prompts (every "
            f"{a.long_every}th row); 1 SGLang engine, 1 trainer rank, disaggregated; all with "
            f"{a.job_flags or 'no more flags'}; fully async with --max-weight-staleness {a.max_weight_staleness} "
            f"--max-inflight-groups {a.max_inflight_groups or 'default'} --pause-generation-mode "
            f"{a.pause_generation_mode}",
            flush=True,
        )
        figs: dict[str, dict[str, float]] = {}
        for name in [*a.modes, *(n for n, _ in variants(a))]:
            try:
                figs[name] = figures(name, run_mode(name, model, work, a, data, tag), a)
            except Exception as exc:  # report it and go on with the other modes
                print(f"  {name} failed: {type(exc).__name__}: {exc}", flush=True)
        if figs:
            report(figs, a)
    finally:
        kill_leftovers(tag, "the benchmark", grace=5)
        if temp and not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"({time.monotonic() - start:.0f}s in all on {os.cpu_count()} cores, load average now {load})")


if __name__ == "__main__":
    main()
