"""Soak run of --use-fault-tolerance: prints figures and a PASS/FAIL line; not a test, not run in CI.

    .venv/bin/python scripts/bench/soak_fault_tolerance.py                    # 50 rollouts, a kill every ~30 s
    .venv/bin/python scripts/bench/soak_fault_tolerance.py --num-rollout 20 --kill-interval 20 --seed 1
    .venv/bin/python scripts/bench/soak_fault_tolerance.py --report-only    # the last run's figures again

The CPU demo's task (scripts/run-tiny-cpu.sh: the tiny Qwen3 with its SFT warm start, single-digit addition, GRPO,
32 prompts x 8 samples, greedy eval on all 100 problems) with two SGLang engines and --use-fault-tolerance, while
this script SIGKILLs a random engine's SGLang process every ~--kill-interval seconds. It kills only when every
engine is back in the router and healthy (one failure at a time), and stops --quiet-tail rollouts before the end so
the last killed engine is restarted within the run. The run's processes are found by a tag in their environment
(output-dir/placement.json is written once, at start-up, so it does not know a restarted engine's pid); the router
is asked, with the run's secret, which engines it serves.

Figures: kills, engine failures and restarts (`rollout/engine_failures`, `rollout/engines_restarted`), seconds from a
kill to every engine serving again, requests re-sent (by sglang-router itself, counted from its log: a request that
failed on a dead engine goes to another one and the client never sees it; and by the client:
`rollout/generate_retries`, `eval/generate_retries`), the group accounting summed over rollouts (drawn = trained +
failed + dropped + returned: lost must be 0), each rollout's trained groups, and the greedy eval reward before and
after. PASS: the run finished every rollout, at least one kill, a restart for every kill, nothing lost or failed,
and the eval reward rose by at least --min-eval-gain.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import secrets
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import REPO, TAG, kill_leftovers, prepare, tagged_processes  # noqa: E402

API_KEY_ENV = "SLIME_LIKE_API_KEY"  # slime_like.core.secret.API_KEY_ENV: the run's secret, set here to ask the router


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the soak run."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-rollout", type=int, default=50)
    p.add_argument("--kill-interval", type=float, default=30.0, help="mean seconds between kills (+-25%% jitter)")
    p.add_argument("--seed", type=int, default=0, help="the kill schedule's seed (which engine, when)")
    p.add_argument("--output-dir", type=Path, default=REPO / "outputs" / "soak-fault-tolerance")
    p.add_argument("--engines", type=int, default=2, help="SGLang engines (--rollout-num-gpus), at least 2")
    p.add_argument("--health-check-interval", type=float, default=5.0, help="--rollout-health-check-interval")
    p.add_argument("--quiet-tail", type=int, default=4, help="last rollouts without kills")
    p.add_argument("--min-eval-gain", type=float, default=0.1, help="PASS needs final - first eval reward >= this")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds before the run is stopped as hung")
    p.add_argument("--report-only", action="store_true", help="print the figures of the run in --output-dir again")
    args = p.parse_args(argv)
    if args.engines < 2:
        p.error("--engines must be at least 2: a killed engine's requests need another engine to land on")
    if args.num_rollout <= args.quiet_tail:
        p.error("--num-rollout must exceed --quiet-tail")
    return args


def prepare_soak(work: Path) -> tuple[Path, Path]:
    """The demo's tiny model after its 60-step SFT warm start, and its addition data with all.jsonl (train and eval
    rows together); (model, data)."""
    model, data = prepare(work, sft_steps=60), work / "data"
    if not (data / "all.jsonl").exists():
        (data / "all.jsonl").write_text((data / "train.jsonl").read_text() + (data / "eval.jsonl").read_text())
    return model, data


def run_command(args: argparse.Namespace, model: Path, data: Path, out: Path) -> list[str]:
    """The demo's GRPO job (scripts/run-tiny-cpu.sh, no checkpoint saves) on --engines engines, fault tolerant."""
    return [
        sys.executable, "-m", "slime_like.train", "--num-rollout", str(args.num_rollout),
        "--hf-checkpoint", str(model),
        "--prompt-data", str(data / "train.jsonl"), "--input-key", "prompt", "--label-key", "label",
        "--rollout-shuffle", "--rollout-batch-size", "32", "--n-samples-per-prompt", "8",
        "--rollout-temperature", "1.0", "--rollout-max-response-len", "4", "--rollout-stop-token-ids", "2",
        "--rollout-num-gpus", str(args.engines), "--rm-type", "math",
        "--eval-prompt-data", str(data / "all.jsonl"), "--eval-interval", "10", "--eval-temperature", "0",
        "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1", "--max-tokens-per-gpu", "512",
        "--advantage-estimator", "grpo", "--eps-clip", "0.2", "--lr", "3e-4", "--clip-grad", "1.0",
        "--use-fault-tolerance", "--rollout-health-check-interval", str(args.health_check_interval),
        "--output-dir", str(out),
    ]  # fmt: skip


def _flag(cmdline: list[str], flag: str) -> str | None:
    return cmdline[cmdline.index(flag) + 1] if flag in cmdline[:-1] else None


def leaders(tag: str, module: str) -> dict[int, int]:
    """port -> pid of the run's processes running `module` that lead their session (the server, not its children)."""
    out = {}
    for proc in tagged_processes(tag):
        try:
            cmdline = proc.cmdline()
            if module in cmdline and os.getsid(proc.pid) == proc.pid and _flag(cmdline, "--port"):
                out[int(_flag(cmdline, "--port"))] = proc.pid  # type: ignore[arg-type]
        except Exception:  # psutil.Error or OSError: the process just ended
            continue
    return out


def router_ports(tag: str) -> list[int]:
    """Ports the run's router listens on (it renames itself `sglang::router`, so its command line names no port)."""
    ports = []
    for proc in tagged_processes(tag):
        try:
            if "router" in proc.name() and os.getsid(proc.pid) == proc.pid:
                ports += [c.laddr.port for c in proc.net_connections(kind="inet") if c.status == "LISTEN"]
        except Exception:  # psutil.Error or OSError: the process just ended
            continue
    return ports


def served_ports(tag: str, key: str) -> set[int] | None:
    """Ports of the engines the router lists as healthy (None when no router answers)."""
    import requests

    for port in router_ports(tag):  # its HTTP port, and its metrics port that has no /workers
        try:
            resp = requests.get(
                f"http://127.0.0.1:{port}/workers", headers={"Authorization": f"Bearer {key}"}, timeout=5
            )
            workers = resp.json()["workers"]
        except (requests.RequestException, ValueError, KeyError, TypeError):
            continue
        return {int(w["url"].rsplit(":", 1)[1]) for w in workers if w.get("is_healthy", True)}
    return None


def steps_done(out: Path) -> int:
    """Rollouts trained so far (lines of metrics.jsonl with a train loss)."""
    path = out / "metrics.jsonl"
    return sum("train/loss" in line for line in path.read_text().splitlines()) if path.exists() else 0


@dataclass
class Kill:
    """One SIGKILL: when (seconds since the run started), which engine, at which rollout; when it served again."""

    at: float
    port: int
    pid: int
    rollout: int
    serving_again: float | None = None


class Killer(threading.Thread):
    """Every ~interval s, once every engine is served by the router: SIGKILL one engine's SGLang process at random."""

    def __init__(self, args: argparse.Namespace, tag: str, key: str, out: Path, start: float) -> None:
        super().__init__(name="killer", daemon=True)
        self.args, self.tag, self.key, self.out, self.start_time = args, tag, key, out, start
        self.rng = random.Random(args.seed)
        self.kills: list[Kill] = []
        self.deferred = 0.0  # seconds due kills waited for every engine to serve again
        self.stop = threading.Event()

    def now(self) -> float:
        return time.monotonic() - self.start_time

    def run(self) -> None:
        while not self.stop.is_set() and steps_done(self.out) < 1:  # engines and trainer up, one step done
            self.stop.wait(1.0)
        scheduled = due = self.now() + self._interval()
        held = False  # the due kill waited for the engines to serve again
        while not self.stop.wait(1.0):
            recovering = any(k.serving_again is None for k in self.kills)
            serving = self._all_serving() if recovering or self.now() >= due else False
            if self.now() < due:
                continue
            if not serving:
                held = True
                continue
            if held:  # not right at the start of the rollout after the engines came back: at a random point
                held, due = False, self.now() + self.rng.uniform(0.0, 5.0)
                continue
            if steps_done(self.out) >= self.args.num_rollout - self.args.quiet_tail:
                return
            self._kill()
            self.deferred += due - scheduled if due > scheduled else 0.0
            scheduled = due = self.now() + self._interval()

    def _interval(self) -> float:
        return self.args.kill_interval * self.rng.uniform(0.75, 1.25)

    def _kill(self) -> None:
        """SIGKILL a random engine's SGLang process."""
        engines = leaders(self.tag, "sglang.launch_server")
        port = self.rng.choice(sorted(engines))
        try:
            os.kill(engines[port], signal.SIGKILL)
        except ProcessLookupError:
            return
        kill = Kill(self.now(), port, engines[port], steps_done(self.out))
        self.kills.append(kill)
        print(f"[soak {kill.at:6.0f}s] rollout {kill.rollout}: SIGKILL engine :{port} (pid {kill.pid})", flush=True)

    def _all_serving(self) -> bool:
        """Every engine runs and the router serves it; records when killed engines' replacements serve."""
        engines = leaders(self.tag, "sglang.launch_server")
        served = served_ports(self.tag, self.key)
        ok = served is not None and len(engines) == self.args.engines and set(engines) == served
        if ok:
            for kill in self.kills:
                if kill.serving_again is None:
                    kill.serving_again = self.now()
                    print(f"[soak {kill.serving_again:6.0f}s] every engine serves again", flush=True)
        return ok


def total(records: list[dict[str, Any]], key: str) -> int:
    return int(sum(r.get(key, 0) for r in records))


def router_resends(log_dir: Path) -> list[int]:
    """Per burst (one second of a router log), the /generate requests the router sent to a dead engine: sglang-router
    sends them again to another worker itself, so the client never sees (nor counts) those failures."""
    bursts: dict[str, int] = {}
    for path in sorted(log_dir.glob("router_*.log")):
        for line in path.read_text(errors="replace").splitlines():
            line = re.sub(r"\x1b\[[0-9;]*m", "", line)
            if "Failed to send" in line and "route=/generate" in line:
                bursts[f"{path.name} {line[:19]}"] = bursts.get(f"{path.name} {line[:19]}", 0) + 1
    return list(bursts.values())


def report(args: argparse.Namespace, out: Path, log: Path, record: dict[str, Any]) -> bool:
    """Print the figures of the run in `out` (`record`: the soak's own, from run_soak); True when every check passed."""
    code, wall, deferred = record["exit_status"], record["wall_s"], record["deferred_s"]
    metrics = out / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    rollouts = [r for r in records if "train/loss" in r]
    rollout_log = out / "logs" / "rollout.log"  # the rollout manager's own log file (slime_like/core/logs.py)
    text = rollout_log.read_text(errors="replace") if rollout_log.exists() else ""
    kills = [Kill(**k) for k in record["kills"]]
    resends = router_resends(out / "logs")
    restarted = max((r.get("rollout/engines_restarted", 0) for r in records), default=0)
    failures = max((r.get("rollout/engine_failures", 0) for r in records), default=0)
    recovery = [k.serving_again - k.at for k in kills if k.serving_again is not None]
    keys = ("trained", "failed", "dropped", "returned", "carried")
    settled = {k: total(rollouts, f"rollout/groups_{k}") for k in keys}
    drawn = total(rollouts, "rollout/groups_drawn")
    lost_per = [r.get("rollout/groups_drawn", 0) - sum(r.get(f"rollout/groups_{k}", 0) for k in keys) for r in rollouts]
    trained = [int(r.get("rollout/groups_trained", 0)) for r in rollouts]
    evals = [(r["step"], r["eval/reward_mean"]) for r in records if "eval/reward_mean" in r]
    retry_keys = sorted({k for r in records for k in r if "retr" in k or "resent" in k or "resubmit" in k})

    print(f"\n== soak of --use-fault-tolerance: {len(rollouts)}/{args.num_rollout} rollouts, {args.engines} engines, "
          f"seed {args.seed}, {wall / 60:.1f} min, run exit status {code}")  # fmt: skip
    print(f"kills (SIGKILL of an engine's SGLang process): {len(kills)} at rollouts {[k.rollout for k in kills]}; "
          f"due kills waited {deferred:.0f} s in all for every engine to serve")  # fmt: skip
    print(f"engine failures seen by the health checks: {failures} (log lines: {text.count('failed its health check')})")
    print(f"engines restarted (rollout/engines_restarted): {restarted} (log lines: {text.count('restarted engine')})")
    if recovery:
        print(f"kill -> every engine served again: median {statistics.median(recovery):.0f} s, max {max(recovery):.0f} s"
              f" ({len(recovery)}/{len(kills)} recovered)")  # fmt: skip
    print(f"requests re-sent by sglang-router (sent to a dead engine, then to another): {sum(resends)} in "
          f"{len(resends)} burst(s) {resends}")  # fmt: skip
    for key in sorted({"rollout/generate_retries", "eval/generate_retries", *retry_keys}):
        print(f"requests re-sent by the client ({key}, summed over the run): {total(records, key)}")
    print(f"groups over all rollouts: drawn {drawn} = trained {settled['trained']} + failed {settled['failed']} + "
          f"dropped {settled['dropped']} + returned {settled['returned']} + carried {settled['carried']}; "
          f"lost {sum(lost_per)} (per rollout: max {max(lost_per, default=0)})")  # fmt: skip
    print(f"samples trained: {total(rollouts, 'rollout/num_samples')}; failed sample rate summed: "
          f"{sum(r.get('rollout/failed_rate', 0.0) for r in rollouts):.3f}")  # fmt: skip
    counts = {n: trained.count(n) for n in sorted(set(trained))}
    print(f"trained groups per rollout: {', '.join(f'{n} x{c}' for n, c in counts.items())} ({trained})")
    if evals:
        print(f"eval reward (greedy, all 100 problems): {evals[0][1]:.2f} at step {evals[0][0]} -> {evals[-1][1]:.2f} "
              f"at step {evals[-1][0]}; curve {' '.join(f'{s}:{v:.2f}' for s, v in evals)}")  # fmt: skip

    checks = {
        "the run finished": code == 0 and len(rollouts) == args.num_rollout,
        "at least one kill": len(kills) >= 1,
        "a restart for every kill": restarted >= len(kills),
        "no group lost": all(n == 0 for n in lost_per),
        "no group failed": settled["failed"] == 0,
        "every rollout trained all 32 groups": all(n == 32 for n in trained),
        f"eval reward rose by >= {args.min_eval_gain}": len(evals) >= 2
        and evals[-1][1] - evals[0][1] >= args.min_eval_gain,
    }
    for name, ok in checks.items():
        print(f"  [{'ok' if ok else 'FAIL'}] {name}")
    passed = all(checks.values())
    print(f"{'PASS' if passed else 'FAIL'}: soak of --use-fault-tolerance ({len(kills)} kills, log {log})")
    return passed


def run_soak(args: argparse.Namespace, work: Path, out: Path, log: Path) -> dict[str, Any]:
    """Run the job while killing engines; the soak's record (also saved as output-dir/soak.json)."""
    model, data = prepare_soak(work)
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tag, key = secrets.token_hex(8), secrets.token_urlsafe(16)
    env = {**os.environ, TAG: tag, API_KEY_ENV: key, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}  # fmt: skip
    env.pop("RAY_ADDRESS", None)  # a local Ray instance of its own
    print(f"[soak] {args.num_rollout} rollouts, a kill every ~{args.kill_interval:.0f} s; run log {log}", flush=True)
    start = time.monotonic()
    killer = Killer(args, tag, key, out, start)
    with open(log, "w") as f:
        proc = subprocess.Popen(
            run_command(args, model, data, out), cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT
        )
        killer.start()
        try:
            code = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"[soak] the run passed --timeout {args.timeout:.0f} s: stopping it", flush=True)
            proc.send_signal(signal.SIGINT)
            try:
                code = proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
        finally:
            killer.stop.set()
            killer.join(timeout=30)
    wall = time.monotonic() - start
    kill_leftovers(tag, "the soak run", grace=5)  # Ray tears its workers down as the driver exits
    record = {
        "exit_status": code,
        "wall_s": wall,
        "deferred_s": killer.deferred,
        "kills": [asdict(k) for k in killer.kills],
    }
    (work / "soak.json").write_text(json.dumps(record, indent=1))
    return record


def main(argv: list[str] | None = None) -> int:
    """Prepare the task, run the job while killing engines, print the figures."""
    args = parse_args(argv)
    work = args.output_dir.resolve()
    out, log = work / "run", work / "run.log"
    if args.report_only:
        record = json.loads((work / "soak.json").read_text())
    else:
        record = run_soak(args, work, out, log)
    return 0 if report(args, out, log, record) else 1


if __name__ == "__main__":
    sys.exit(main())
