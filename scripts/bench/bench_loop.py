"""Benchmark of the RL loop on a tiny model: prints figures, asserts nothing.

    .venv/bin/python scripts/bench/bench_loop.py                 # everything, ~5-6 minutes on 2 cores
    .venv/bin/python scripts/bench/bench_loop.py --only rollout train

Sections (figures and goals are explained in scripts/bench/README.md):
  loop     `slime_like.train` (sync) and `slime_like.train_async` (one step ahead) as subprocesses:
           per-phase medians from metrics.jsonl; async step / max(generate, log-prob + train).
  rollout  tokens/s of the project's generate function through sglang-router vs the same requests
           POSTed straight to the SGLang server (and generate() straight to the server, to split the
           difference into router and client side), interleaved, medians.
  train    TrainActor.train's optimizer-step time (the engine's train_step with the project's loss) vs a
           bare Megatron forward/backward/optimizer step on the same packed micro-batches, one process; and its
           log-prob phase (old log-probs, advantages, metrics) vs a bare no-grad forward of those micro-batches.
  update   where a weight update's time goes: HF export, /flush_cache, the whole TrainActor.update_weights.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import REPO, TAG, job_flags, kill_leftovers, median, prepare, prompt_rows, run_logged  # noqa: E402
from bench_loop_train import TrainSection  # noqa: E402

SECTIONS = ("loop", "rollout", "train", "update")
GOALS = {  # figure -> (name, comparison, goal); "update" is informational
    "loop": ("async step / max(gen, logprob+train)", "<=", 1.15),
    "rollout": ("rollout path / direct server (tok/s)", ">=", 0.95),
    "train": ("train step / bare Megatron step", "<=", 1.10),
    "logprob": ("log-prob phase / bare no-grad forward", "<=", 1.10),
}
FIGURES = {"loop": ("loop",), "rollout": ("rollout",), "train": ("train", "logprob"), "update": ()}  # by section
PHASES = (
    ("generate", "rollout/time"),
    ("log-prob", "time/logprob"),
    ("train", "time/train"),
    ("weight update", "time/update_weights"),
    ("step", "time/step"),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the benchmark."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="sections to run")
    p.add_argument("--work-dir", default=None, help="model, data, runs and logs (default: a temp dir, removed)")
    p.add_argument("--keep", action="store_true", help="keep the temp work dir (logs of every process)")
    p.add_argument("--sft-steps", type=int, default=0, help="SFT warm start steps (0: the random base model)")
    # The job, the demo's shape: 32 prompts x 8 samples, short responses, 512-token micro-batches.
    p.add_argument("--num-rollout", type=int, default=8, help="rollouts per loop run")
    p.add_argument("--warmup", type=int, default=2, help="loop steps skipped before taking medians")
    p.add_argument("--rollout-batch-size", type=int, default=32)
    p.add_argument("--n-samples-per-prompt", type=int, default=8)
    p.add_argument("--max-response-len", type=int, default=8, help="loop and train sections")
    p.add_argument("--max-tokens-per-gpu", type=int, default=512)
    p.add_argument("--gen-tokens", type=int, default=16, help="rollout section: new tokens per request (ignore_eos)")
    p.add_argument(
        "--num-servers", type=int, default=1, help="SGLang servers behind the router (loops and in-process sections)"
    )
    p.add_argument("--rounds", type=int, default=5, help="rollout section: measurements of each path")
    p.add_argument(
        "--split-rollout", action="store_true", help="rollout section: also generate() straight to the server"
    )
    p.add_argument("--train-repeats", type=int, default=6, help="train section: measured steps per variant")
    p.add_argument("--quick", action="store_true", help="fewer repeats: 5 rollouts (1 skipped), 3 rounds, 4 repeats")
    args = p.parse_args(argv)
    if args.quick:
        args.num_rollout, args.warmup, args.rounds, args.train_repeats = 5, 1, 3, 4
    return args


class Bench(TrainSection):
    """State shared by the in-process sections: the servers and router, the trainer rank (section 3 in TrainSection)."""

    def __init__(self, args: argparse.Namespace, work: Path, model: Path, tag: str) -> None:
        self.args, self.work, self.model, self.tag = args, work, model, tag
        self.servers: list[Any] = []
        self.router: Any = None
        self.actor: Any = None

    # ------------------------------------------------------------ 1. sync and async loops

    def run_loop(self, module: str) -> tuple[list[dict], dict[str, float]]:
        """Run one entry point as a subprocess; its measured step records and its wall-clock breakdown."""
        out = self.work / "runs" / module.rsplit(".", 1)[-1]
        shutil.rmtree(out, ignore_errors=True)
        flags = job_flags(self.model, self.work, self.args, self.args.max_response_len)
        flags[flags.index("--output-dir") + 1] = str(out)
        try:
            lines = run_logged([sys.executable, "-m", module, *flags], self.work / "logs" / f"{out.name}.log", 420)
        finally:
            kill_leftovers(self.tag, module, grace=10)
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
        steps = [r for r in records if "time/step" in r and "rollout/time" in r]
        step_lines = [t for t, text in lines if text.startswith("[step ")]
        wall = lines[-1][0] if lines else float("nan")
        timing = {"wall": wall}
        if step_lines and steps:
            timing["start-up"] = step_lines[0] - steps[0]["time/step"]  # launch -> first step began
            timing["after last step"] = wall - step_lines[-1]
        return steps[self.args.warmup :], timing

    def loops(self) -> float:
        """Section 1; returns async step / max(generate, log-prob + train) of the async run."""
        a = self.args
        print("\n== 1. RL loop phases (medians over measured steps, seconds) ==", flush=True)
        print(
            f"job: {a.rollout_batch_size} prompts x {a.n_samples_per_prompt} samples, responses <= {a.max_response_len}"
            f" tokens, micro-batches <= {a.max_tokens_per_gpu} tokens, {a.num_rollout} rollouts per run (first "
            f"{a.warmup} skipped), {a.num_servers} SGLang server, 1 trainer rank, distributed weight update",
            flush=True,
        )
        runs, timings = {}, {}
        for label, module in (("sync", "slime_like.train"), ("async", "slime_like.train_async")):
            records, timings[label] = self.run_loop(module)
            runs[label] = {name: median([r[key] for r in records if key in r]) for name, key in PHASES}
            runs[label]["tokens/rollout"] = median([r.get("rollout/generated_tokens", 0) for r in records])
        sync, asy = runs["sync"], runs["async"]
        print(f"  {'phase':<22}{'sync':>9}{'async':>9}")
        for name, _ in PHASES:
            print(f"  {name:<22}{sync[name]:>9.3f}{asy[name]:>9.3f}")
        for name in ("tokens/rollout",):
            print(f"  {name:<22}{sync[name]:>9.0f}{asy[name]:>9.0f}")
        for name in ("start-up", "after last step", "wall"):
            print(f"  {'process ' + name:<22}{timings['sync'].get(name, float('nan')):>9.1f}"
                  f"{timings['async'].get(name, float('nan')):>9.1f}")  # fmt: skip
        rest = sync["step"] - sum(sync[n] for n in ("generate", "log-prob", "train", "weight update"))
        print(f"  sync step - sum of its phases = {rest:.3f}s (Ray transfers, train data, logging)")
        lp_train = asy["log-prob"] + asy["train"]
        bound = max(asy["generate"], lp_train)
        ratio = asy["step"] / bound
        print(
            f"  async step {asy['step']:.3f} / max(generate {asy['generate']:.3f}, log-prob+train {lp_train:.3f}) "
            f"= {ratio:.2f} (goal <= 1.15)"
        )
        sync_bound = max(sync["generate"], sync["log-prob"] + sync["train"])
        print(
            f"  async step / max of the sync run's (uncontended) phases = {asy['step'] / sync_bound:.2f}; "
            f"async is {sync['step'] / asy['step']:.2f}x faster per step than sync"
        )
        floor = (bound + asy["weight update"]) / bound
        print(
            f"  the weight update runs after both overlapped phases (never under in-flight requests): "
            f"(max + update) / max = {floor:.2f} is this loop's floor"
        )
        if ratio > 1.15:
            print(
                f"  MISS: the serial weight update alone is {asy['weight update'] / bound:.0%} of the bound; and on "
                f"{os.cpu_count()} cores SGLang generation and Megatron training compete for CPU while they overlap"
            )
        return ratio

    # ------------------------------------------------------------ servers and trainer rank (untimed start-up)

    def prepare_inproc(self, servers: bool, actor: bool) -> None:
        """Launch the server(s), build the trainer rank meanwhile (both untimed), then start the router."""
        from rollout.router import SGLangRouter
        from rollout.sglang_server import SGLangServer

        print("\n== in-process sections: start-up (untimed) ==", flush=True)
        log_dir = self.work / "logs"
        start = time.monotonic()
        if servers:
            self.servers = [SGLangServer(self.model, log_dir=log_dir) for _ in range(self.args.num_servers)]
            for server in self.servers:
                server.start(wait=False)
        if actor:
            self.make_actor()
            print(f"  trainer rank (Megatron, world of one) built in {time.monotonic() - start:.1f}s", flush=True)
        if servers:
            for server in self.servers:
                server.wait_ready()
            ready = time.monotonic()
            self.router = SGLangRouter([s.url for s in self.servers], log_dir=log_dir).start()
            print(
                f"  SGLang server(s) healthy {ready - start:.1f}s after launch, router ready {time.monotonic() - ready:.1f}s"
                " after that (RolloutManager also starts the router only once the servers are healthy)",
                flush=True,
            )

    def stop_servers(self) -> None:
        """Stop the router and the servers (SIGTERM, then SIGKILL)."""
        if self.router is not None:
            self.router.stop()
        for server in self.servers:
            server.stop()
        self.servers, self.router = [], None

    # ------------------------------------------------------------ 2. rollout path throughput

    async def _project_round(self, run_args: Any, params: dict, path_url: str) -> tuple[int, float]:
        """RolloutManager-style: the project's generate function, one request per sample, via `path_url`."""
        import aiohttp

        from rollout.generate import RolloutContext, generate
        from slime_like.core.sample import Sample

        rows = [r for r in prompt_rows(self.work, self.args.rollout_batch_size) for _ in range(run_args.n_samples_per_prompt)]  # fmt: skip
        samples = [Sample(prompt=r["prompt"], label=r["label"], index=i, group_index=i) for i, r in enumerate(rows)]
        conc = run_args.sglang_server_concurrency * len(self.servers)  # what RolloutManager uses
        start = time.perf_counter()
        timeout = aiohttp.ClientTimeout(total=run_args.rollout_request_timeout)
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=conc)) as session:
            fields = {f.name for f in dataclasses.fields(RolloutContext)}
            extra = {"server_urls": [s.url for s in self.servers]} if "server_urls" in fields else {}
            ctx = RolloutContext(
                args=run_args, tokenizer=self.tokenizer, router_url=path_url, session=session,
                semaphore=asyncio.Semaphore(conc), **extra,
            )  # fmt: skip
            await asyncio.gather(*(generate(ctx, s, params) for s in samples))
        elapsed = time.perf_counter() - start
        failed = [s for s in samples if s.status.value in ("failed", "aborted")]
        if failed:
            raise RuntimeError(f"{len(failed)} requests failed, e.g. {failed[0].metadata}")
        return sum(s.response_length for s in samples), elapsed

    async def _direct_round(self, run_args: Any, params: dict, ids: list[list[int]]) -> tuple[int, float]:
        """The same requests (prompt tokens, sampling params and seeds, concurrency) POSTed to the servers."""
        import aiohttp

        conc = run_args.sglang_server_concurrency * len(self.servers)
        sem = asyncio.Semaphore(conc)
        urls = [s.url for s in self.servers]

        async def one(i: int, session: aiohttp.ClientSession) -> int:
            sp = {**params, "sampling_seed": (run_args.rollout_seed * 1_000_003 + i) % (2**31)}
            rid = f"direct-{i}-{uuid.uuid4().hex[:8]}"
            payload = {"input_ids": ids[i], "sampling_params": sp, "return_logprob": True, "rid": rid}
            async with sem, session.post(f"{urls[i % len(urls)]}/generate", json=payload) as resp:
                body = await resp.json(content_type=None)
                if resp.status != 200:
                    raise RuntimeError(f"/generate answered {resp.status}: {body}")
            return len(body["meta_info"]["output_token_logprobs"])

        start = time.perf_counter()
        timeout = aiohttp.ClientTimeout(total=run_args.rollout_request_timeout)
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=conc)) as session:
            counts = await asyncio.gather(*(one(i, session) for i in range(len(ids))))
        return sum(counts), time.perf_counter() - start

    def rollout(self) -> float:
        """Section 2; returns the median over rounds of project-path tok/s / direct tok/s."""
        from transformers import AutoTokenizer

        from rollout.generate import prompt_token_ids, sampling_params_from_args
        from slime_like.arguments import parse_args as parse_run_args

        a = self.args
        run_args = parse_run_args(job_flags(self.model, self.work, a, a.gen_tokens))
        n = a.rollout_batch_size * a.n_samples_per_prompt
        conc = run_args.sglang_server_concurrency * a.num_servers
        print("\n== 2. Rollout path throughput (generated tokens/s) ==", flush=True)
        print(
            f"{n} requests x {a.gen_tokens} new tokens (ignore_eos, temperature 1), concurrency {conc}, "
            f"{a.num_servers} server(s); {a.rounds} rounds per path, alternating order, after a warm-up of each",
            flush=True,
        )
        self.tokenizer = AutoTokenizer.from_pretrained(self.model)
        params = {**sampling_params_from_args(run_args), "ignore_eos": True}
        rows = [r for r in prompt_rows(self.work, a.rollout_batch_size) for _ in range(a.n_samples_per_prompt)]
        ids = [prompt_token_ids(self.tokenizer, r["prompt"]) for r in rows]
        paths = {
            "generate() via router": lambda: self._project_round(run_args, params, self.router.url),
            "POST to server": lambda: self._direct_round(run_args, params, ids),
        }
        if a.split_rollout and a.num_servers == 1:
            paths["generate() to server"] = lambda: self._project_round(run_args, params, self.servers[0].url)
        names = list(paths)
        for name in names:
            asyncio.run(paths[name]())
        results: dict[str, list[float]] = {name: [] for name in names}
        for r in range(a.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                tokens, elapsed = asyncio.run(paths[name]())
                results[name].append(tokens / elapsed)
        for name in names:
            values = results[name]
            print(f"  {name:<24}{median(values):8.0f} tok/s  (rounds: {' '.join(f'{v:.0f}' for v in values)})")
        proj, direct = results[names[0]], results[names[1]]
        paired = median([x / y for x, y in zip(proj, direct, strict=True)])
        print(f"  project path / direct: ratio of medians {median(proj) / median(direct):.3f}, median of per-round "
              f"ratios {paired:.3f} (the figure; goal >= 0.95)")  # fmt: skip
        if "generate() to server" in results:
            client = median([x / y for x, y in zip(results["generate() to server"], direct, strict=True)])
            print(
                f"  split: generate() straight to the server / direct = {client:.3f} (client side); the rest is the router"
            )
        if paired < 0.95:
            print(
                f"  MISS: on {os.cpu_count()} cores the router process and the client compete with the SGLang "
                "scheduler for CPU"
            )
        return paired

    # ------------------------------------------------------------ 4. weight update breakdown

    def update(self) -> None:
        """Section 4 (informational): export, /flush_cache and the whole update, medians of 4."""
        from rollout.sglang_client import flush_cache

        print("\n== 4. Weight update breakdown (TrainActor -> SGLang, distributed transport) ==", flush=True)
        urls = [s.url for s in self.servers]
        out = str(self.work / "runs" / "inproc")
        timing: dict[str, list[float]] = {
            "TrainActor.update_weights": [],
            "engine.export_hf_weights": [],
            "/flush_cache": [],
        }
        self.actor.update_weights(urls, 1, "distributed", out)  # connects the weight-sync group
        for version in range(2, 6):
            start = time.perf_counter()
            self.actor.update_weights(urls, version, "distributed", out)
            timing["TrainActor.update_weights"].append(time.perf_counter() - start)
            start = time.perf_counter()
            list(self.actor.engine.export_hf_weights())
            timing["engine.export_hf_weights"].append(time.perf_counter() - start)
            start = time.perf_counter()
            flush_cache(urls[0])
            timing["/flush_cache"].append(time.perf_counter() - start)
        for name, values in timing.items():
            print(f"  {name:<28}{median(values) * 1e3:8.1f} ms  ({' '.join(f'{v * 1e3:.0f}' for v in values)})")
        share = median(timing["/flush_cache"]) / median(timing["TrainActor.update_weights"])
        print(
            f"  one /flush_cache alone takes {share:.0%} of a whole update (on CPU SGLang's flush runs gc.collect() in "
            "the scheduler: ~0.33 s over its start-up heap, a few ms once SGLangServer has called /freeze_gc)"
        )
        transport = getattr(self.actor, "transport", None)
        if transport is not None:
            transport.close()


# ---------------------------------------------------------------- main


def verdict(key: str, value: float) -> str:
    """PASS or MISS against the section's goal."""
    _, op, goal = GOALS[key]
    if value != value:  # NaN: the section failed
        return "n/a"
    return "PASS" if (value <= goal if op == "<=" else value >= goal) else "MISS"


def main(argv: list[str] | None = None) -> None:
    """Run the selected sections and print the summary."""
    args = parse_args(argv)
    tag = uuid.uuid4().hex
    os.environ.update({TAG: tag, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    os.environ.pop("RAY_ADDRESS", None)  # each loop starts (and stops) its own local Ray instance
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, str(REPO))
    warnings.filterwarnings("ignore", category=UserWarning)  # Megatron's "Apex/TE not installed" notes
    temp = args.work_dir is None
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="slime_bench_")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"slime-like loop benchmark: {os.cpu_count()} CPU cores, load average {load}, work dir {work}", flush=True)
    results: dict[str, float] = {}
    bench = None
    try:
        model = prepare(work, args.sft_steps)
        print(
            f"model: {model.name} (Qwen3, hidden 128, ffn 256, 4 layers, {'SFT' if args.sft_steps else 'random init'})"
        )
        bench = Bench(args, work, model, tag)
        sections = {"loop": bench.loops, "rollout": bench.rollout, "train": bench.train, "update": bench.update}
        for key in SECTIONS:
            if key not in args.only:
                continue
            if key != "loop" and not (bench.servers or bench.actor):
                try:
                    bench.prepare_inproc(
                        servers=bool({"rollout", "update"} & set(args.only)),
                        actor=bool({"train", "update"} & set(args.only)),
                    )
                except Exception as exc:
                    print(f"  start-up failed: {type(exc).__name__}: {exc}", flush=True)
                    results.update({k: float("nan") for sec in args.only if sec != "loop" for k in FIGURES[sec]})
                    break
            began = time.monotonic()
            try:
                value = sections[key]()
                if isinstance(value, dict):
                    results.update(value)
                elif key in GOALS:
                    results[key] = value
            except Exception as exc:  # report it and go on with the other sections
                print(f"  section {key} failed: {type(exc).__name__}: {exc}", flush=True)
                results.update({k: float("nan") for k in FIGURES[key]})
            print(f"  ({key} section: {time.monotonic() - began:.0f}s)", flush=True)
    finally:
        if bench is not None:
            bench.stop_servers()
        kill_leftovers(tag, "the benchmark", grace=5)
        if temp and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\n== Summary ({time.monotonic() - start:.0f}s on {os.cpu_count()} cores, load average now {load}) ==")
    print(f"  {'figure':<40}{'value':>8}  {'goal':<9}{'result':>6}")
    for key, value in results.items():
        name, op, goal = GOALS[key]
        print(f"  {name:<40}{value:>8.3f}  {op} {goal:<6.2f}{verdict(key, value):>6}")


if __name__ == "__main__":
    main()
