"""Starts that never fail: start and stop the whole stack, and SGLang engines alone, many times; count the failures.

    .venv/bin/python scripts/bench/bench_starts.py --full 30 --engine 150      # ~1 h on 2 busy cores
    .venv/bin/python scripts/bench/bench_starts.py --only engine --engine 1000
    .venv/bin/python scripts/bench/bench_starts.py --full 1 --engine 2 --keep  # a smoke run, logs kept

Full start: a fresh process runs what `python -m slime_like.train` runs before its first rollout (`slime_like.run.Run`:
a local Ray instance, the rollout manager with --full-engines SGLang engines behind sglang-router, the Megatron
trainer rank, the per-run secret), sends one /generate through the router with the run's secret (the first rollout
is servable), then leaves the run (`Run.__exit__`: trainer, engines and router stopped) and Ray. Timed from nothing
(the process's start) to served, and the stop; a start fails when the process exits non-zero, prints no result, or
passes --full-timeout. Processes of a start still alive 5 s after it ended are counted (and killed) as leftovers.

Engine start: `rollout.sglang_server.SGLangServer` on a free port, with a secret, until /health answers, one
authorised /generate, then stop; --engine-concurrency of them at once (the fleet starts its engines together,
which is when ports race).

Failures are counted by cause (`classify`): port races, timeouts, secrets/auth, other (with the message). Prints
per-start times (median, p95, max) and a summary; --json writes them too.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import REPO, TAG, kill_leftovers, prepare, tagged_processes  # noqa: E402

RESULT = "BENCH_STARTS_RESULT "  # the full-start child's last line: this prefix, then its phases as JSON
FAILURE = "BENCH_STARTS_FAILURE "  # or this prefix, then the error as JSON
PORT_RACE, TIMEOUT, AUTH, OTHER = "port race", "timeout", "secret/auth", "other"
CAUSES = (PORT_RACE, TIMEOUT, AUTH, OTHER)
# Checked in this order: a start that timed out because its server could not bind is a port race, and one whose
# requests were refused for the key is an auth failure however long it waited.
PATTERNS = {
    PORT_RACE: re.compile(
        r"address already in use|errno 98\b|eaddrinuse|portinuseerror|port \d+ on \S+ is already in use"
        r"|failed to bind|bind\(\) failed|could not bind|no free port",
        re.IGNORECASE,
    ),
    AUTH: re.compile(
        r"\b401\b|\b403\b|unauthori[sz]ed|forbidden|authenticationerror|authentication failed"
        r"|invalid (api[ -_]?key|token)",
        re.IGNORECASE,
    ),
    # Not a bare "timeout": SGLang logs its arguments (watchdog_timeout=...) and a log tail may hold them.
    TIMEOUT: re.compile(
        r"timed out|timeouterror|did not become|deadline exceeded|gave no 200 within|no result within",
        re.IGNORECASE,
    ),
}


def classify(text: str) -> tuple[str, str]:
    """The cause of a failed start from its error text (the headline, then e.g. a log tail), and the line that says
    so (for `other`: the last line that names an error, else the headline). The headline decides first:
    a start that gave up waiting is a timeout whatever its log holds; one that died says why in its log."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for group in (lines[:1], lines[1:]):
        for cause in (PORT_RACE, AUTH, TIMEOUT):
            for line in group:
                if PATTERNS[cause].search(line):
                    return cause, line[:300]
    errors = [line for line in lines if re.search(r"error|exception|failed|killed", line, re.IGNORECASE)]
    return OTHER, (errors[-1] if errors else lines[0] if lines else "no output")[:300]


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank q-th percentile (0 < q <= 100) of `values`; NaN for none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def time_figures(values: list[float]) -> str:
    """`median X s, p95 Y s, max Z s (n)` of some durations."""
    if not values:
        return "no values"
    return (
        f"median {percentile(values, 50):.1f} s, p95 {percentile(values, 95):.1f} s, "
        f"max {max(values):.1f} s (n={len(values)})"
    )


@dataclass
class Start:
    """One start: its kind and index, whether it served, its phase times (seconds), the failure and leftovers."""

    kind: str
    index: int
    ok: bool = False
    times: dict[str, float] = field(default_factory=dict)
    cause: str | None = None
    message: str | None = None
    leftovers: int = 0


@dataclass
class Tally:
    """The starts of one kind and what they add up to."""

    kind: str
    starts: list[Start] = field(default_factory=list)

    def add(self, start: Start) -> None:
        self.starts.append(start)
        state = "ok" if start.ok else f"FAILED ({start.cause}: {start.message})"
        times = " ".join(f"{k} {v:.1f}s" for k, v in start.times.items())
        extra = f"; {start.leftovers} leftover process(es)" if start.leftovers else ""
        print(f"[{self.kind} {start.index:4d}] {state} {times}{extra}", flush=True)

    def summary(self) -> dict[str, Any]:
        failed = [s for s in self.starts if not s.ok]
        causes = Counter(s.cause for s in failed)
        phases = sorted({k for s in self.starts if s.ok for k in s.times})
        return {
            "kind": self.kind,
            "starts": len(self.starts),
            "failures": len(failed),
            "by_cause": {c: causes.get(c, 0) for c in CAUSES},
            "messages": [f"#{s.index} {s.cause}: {s.message}" for s in failed],
            "with_leftovers": sum(1 for s in self.starts if s.leftovers),
            "times": {p: time_figures([s.times[p] for s in self.starts if s.ok and p in s.times]) for p in phases},
        }


def print_summary(summary: dict[str, Any]) -> None:
    """The figures of one kind of start."""
    causes = ", ".join(f"{c} {n}" for c, n in summary["by_cause"].items())
    print(f"\n== {summary['kind']} starts: {summary['starts']}, failures {summary['failures']} ({causes}); "
          f"starts that left processes behind: {summary['with_leftovers']}")  # fmt: skip
    for phase, figures in summary["times"].items():
        print(f"  {phase:>8}: {figures}")
    for message in summary["messages"]:
        print(f"  {message}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the benchmark."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--full", type=int, default=30, help="full starts (Ray, engines, router, trainer)")
    p.add_argument("--engine", type=int, default=150, help="engine starts alone")
    p.add_argument("--only", choices=("full", "engine"), default=None, help="run one kind of start only")
    p.add_argument("--full-engines", type=int, default=2, help="SGLang engines in a full start (--rollout-num-gpus)")
    p.add_argument("--engine-concurrency", type=int, default=2, help="engines started at once in the engine part")
    p.add_argument("--full-minutes", type=float, default=None, help="start no full start after this many minutes")
    p.add_argument("--engine-minutes", type=float, default=None, help="start no engine round after this many minutes")
    p.add_argument("--full-timeout", type=float, default=300.0, help="seconds before a full start counts as hung")
    p.add_argument("--engine-timeout", type=float, default=180.0, help="SGLang's start-up timeout")
    p.add_argument("--work-dir", type=Path, default=None, help="model, data and logs (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the logs of the starts that served (failed: always)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    p.add_argument("--full-start-child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.only == "full":
        args.engine = 0
    elif args.only == "engine":
        args.full = 0
    return args


# ---------------------------------------------------------------- a full start (the child process)


def served(url: str, headers: dict[str, str]) -> None:
    """One short greedy /generate at `url` with `headers`; raises unless it answers 200 with text."""
    import requests

    body = {"text": "1+1=", "sampling_params": {"max_new_tokens": 2, "temperature": 0.0}}
    resp = requests.post(f"{url}/generate", json=body, headers=headers, timeout=60)
    if resp.status_code != 200 or "text" not in resp.json():
        raise RuntimeError(f"POST {url}/generate answered {resp.status_code}: {resp.text[:200]}")


def full_start_child(train_argv: list[str]) -> int:
    """Start a run as `slime_like.train` does, serve one request through the router, stop; print RESULT or FAILURE."""
    start = time.monotonic()
    times: dict[str, float] = {}
    try:
        from slime_like.arguments import parse_args as parse_train_args

        train_args = parse_train_args(train_argv)
        import ray

        from slime_like.core.secret import auth_headers
        from slime_like.run import Run

        with Run(train_args) as run:
            times["ready"] = time.monotonic() - start
            served(ray.get(run.rollout.router_info.remote())["url"], auth_headers())
            times["served"] = time.monotonic() - start
            stopping = time.monotonic()
        ray.shutdown()
        times["stop"] = time.monotonic() - stopping
    except BaseException as exc:  # reported to the parent, which classifies the message (a traceback quotes code)
        traceback.print_exc()
        print(FAILURE + json.dumps({"error": f"{type(exc).__name__}: {exc}", "times": times}), flush=True)
        return 1
    print(RESULT + json.dumps(times), flush=True)
    return 0


# ---------------------------------------------------------------- the parent


def full_flags(args: argparse.Namespace, model: Path, work: Path, out: Path) -> list[str]:
    """The demo's job (as the soak runs it) on --full-engines engines, one trainer rank."""
    return [
        "--num-rollout", "1", "--hf-checkpoint", str(model),
        "--prompt-data", str(work / "data" / "train.jsonl"), "--input-key", "prompt", "--label-key", "label",
        "--rollout-batch-size", "32", "--n-samples-per-prompt", "8", "--rollout-max-response-len", "4",
        "--rollout-stop-token-ids", "2", "--rollout-num-gpus", str(args.full_engines), "--rm-type", "math",
        "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1", "--max-tokens-per-gpu", "512",
        "--advantage-estimator", "grpo", "--lr", "3e-4", "--output-dir", str(out),
    ]  # fmt: skip


def run_full(args: argparse.Namespace, model: Path, work: Path, index: int) -> Start:
    """One full start in a fresh process; its log under work/logs (removed when it served, unless --keep)."""
    out, log = work / "runs" / f"full_{index}", work / "logs" / f"full_{index}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    tag = secrets.token_hex(8)
    env = {**os.environ, TAG: tag, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(REPO)}  # fmt: skip
    for name in ("RAY_ADDRESS", "SLIME_LIKE_API_KEY"):  # a local Ray instance and a secret of its own
        env.pop(name, None)
    cmd = [sys.executable, __file__, "--full-start-child", *full_flags(args, model, work, out)]
    result = Start("full", index)
    began = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
        try:
            code = proc.wait(timeout=args.full_timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
            result.cause, result.message = TIMEOUT, f"no result within --full-timeout {args.full_timeout:.0f} s"
    result.times["process"] = time.monotonic() - began
    lines = log.read_text(errors="replace").splitlines()
    for line in reversed(lines):
        if line.startswith(RESULT) and code == 0:
            result.ok = True
            result.times = {**json.loads(line[len(RESULT) :]), **result.times}
            break
        if line.startswith(FAILURE):
            failure = json.loads(line[len(FAILURE) :])
            result.cause, result.message = classify(failure["error"])
            result.times = {**failure["times"], **result.times}
            break
    if not result.ok and result.cause is None:  # died without a word: its last lines say why
        result.cause, result.message = classify(f"exit status {code}\n" + "\n".join(lines[-40:]))
    result.leftovers = len(tagged_processes(tag)) if _linger(tag, 5.0) else 0
    kill_leftovers(tag, f"full start {index}")
    if result.ok and not args.keep:
        shutil.rmtree(out, ignore_errors=True)
        log.unlink(missing_ok=True)
    return result


def _linger(tag: str, grace: float) -> bool:
    """Whether processes of `tag` are still alive after `grace` seconds."""
    deadline = time.monotonic() + grace
    while tagged_processes(tag):
        if time.monotonic() > deadline:
            return True
        time.sleep(0.5)
    return False


def run_engine(args: argparse.Namespace, model: Path, work: Path, index: int, key: str) -> Start:
    """One SGLang server: start on a free port, ready, one authorised /generate, stop."""
    from rollout.sglang_server import SGLangServer
    from slime_like.core.secret import auth_headers

    result = Start("engine", index)
    log_dir = work / "logs" / f"engine_{index}"
    server = SGLangServer(model, log_dir=log_dir, startup_timeout=args.engine_timeout, dtype="float32", api_key=key)
    began = time.monotonic()
    try:
        server.start()
        result.times["ready"] = time.monotonic() - began
        served(server.url, auth_headers(key))
        result.times["served"] = time.monotonic() - began
        result.ok = True
    except Exception as exc:  # classified and counted
        result.cause, result.message = classify(f"{type(exc).__name__}: {exc}")
    finally:
        stopping = time.monotonic()
        server.stop()
        result.times["stop"] = time.monotonic() - stopping
    if result.ok and not args.keep:
        shutil.rmtree(log_dir, ignore_errors=True)
    return result


def run_engines(args: argparse.Namespace, model: Path, work: Path) -> Tally:
    """--engine starts, --engine-concurrency at a time; leftovers counted per round."""
    tally = Tally("engine")
    tag = os.environ[TAG] = secrets.token_hex(8)  # inherited by every server this process starts
    key = secrets.token_hex(32)
    os.environ.update({"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    until = time.monotonic() + 60 * args.engine_minutes if args.engine_minutes else math.inf
    with ThreadPoolExecutor(args.engine_concurrency) as pool:
        for first in range(0, args.engine, args.engine_concurrency):
            if time.monotonic() > until:
                print(f"[engine] --engine-minutes {args.engine_minutes} passed: {first} of {args.engine} started")
                break
            indices = range(first, min(first + args.engine_concurrency, args.engine))
            results = list(pool.map(lambda i: run_engine(args, model, work, i, key), indices))
            leftovers = len(tagged_processes(tag)) if _linger(tag, 5.0) else 0
            kill_leftovers(tag, f"engine starts {indices[0]}-{indices[-1]}")
            for result in results:
                result.leftovers = leftovers
                tally.add(result)
    return tally


def main(argv: list[str] | None = None) -> int:
    """Prepare the tiny model, run the full starts, then the engine starts; print (and save) the figures."""
    args = parse_args(argv)
    if args.full_start_child is not None:
        return full_start_child(args.full_start_child)
    work = (args.work_dir or Path(tempfile.mkdtemp(prefix="bench_starts_"))).resolve()
    model = prepare(work)
    load = os.getloadavg()
    print(f"[bench_starts] work dir {work}; {os.cpu_count()} CPUs, load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    began = time.monotonic()
    tallies = []
    if args.full:
        tallies.append(Tally("full"))
        until = time.monotonic() + 60 * args.full_minutes if args.full_minutes else math.inf
        for index in range(args.full):
            if time.monotonic() > until:
                print(f"[full] --full-minutes {args.full_minutes} passed: {index} of {args.full} started")
                break
            tallies[-1].add(run_full(args, model, work, index))
    if args.engine:
        tallies.append(run_engines(args, model, work))
    summaries = [t.summary() for t in tallies]
    for summary in summaries:
        print_summary(summary)
    load = os.getloadavg()
    print(
        f"\nwall {(time.monotonic() - began) / 60:.1f} min; load average now {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
    )
    if args.json:
        starts = [asdict(s) for t in tallies for s in t.starts]
        args.json.write_text(json.dumps({"summaries": summaries, "starts": starts}, indent=1))
    failed = sum(s["failures"] for s in summaries)
    print(f"{'PASS' if not failed else 'FAIL'}: {failed} failed start(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
