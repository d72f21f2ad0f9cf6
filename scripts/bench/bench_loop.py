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
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TAG = "SLIME_BENCH_TAG"  # set in every process this benchmark starts, to find leftovers by it
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


# ---------------------------------------------------------------- helpers


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


def prepare(work: Path, args: argparse.Namespace) -> Path:
    """The tiny model (as in the demo), the addition data and optionally an SFT warm start."""
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
    if args.sft_steps <= 0:
        return base
    sft = work / f"sft{args.sft_steps}"
    if not (sft / "model.safetensors").exists():
        run_logged(
            [py, "tools/sft_warmstart.py", "--hf-checkpoint", str(base), "--data", str(data / "sft.jsonl"),
             "--out", str(sft), "--steps", str(args.sft_steps)],
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


class Bench:
    """State shared by the in-process sections: the servers and router, the trainer rank."""

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

    # ------------------------------------------------------------ 3. train step vs bare Megatron step

    def make_actor(self) -> None:
        """A trainer rank in this process (a world of one), as the loop's Ray actor builds it."""
        from slime_like.arguments import parse_args as parse_run_args
        from slime_like.core.process import free_port
        from slime_like.trainer.actor import TrainActor

        run_args = parse_run_args(job_flags(self.model, self.work, self.args, self.args.max_response_len))
        saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
        try:
            self.actor = TrainActor(run_args, 0, "127.0.0.1", free_port())
        finally:  # the process group exists now; children must not inherit a rank
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def train_data(self) -> Any:
        """A rollout's training data: the demo prompts, random responses, 0/1 rewards, rollout log-probs."""
        import torch

        from buffer.train_data import build_train_data
        from rollout.generate import prompt_token_ids
        from slime_like.core.sample import Sample, Status

        a = self.args
        gen = torch.Generator().manual_seed(0)
        tokenizer = self.actor_tokenizer()
        vocab = len(tokenizer)
        groups = []
        for g, row in enumerate(prompt_rows(self.work, a.rollout_batch_size)):
            prompt = prompt_token_ids(tokenizer, row["prompt"])
            group = []
            for k in range(a.n_samples_per_prompt):
                response = torch.randint(3, vocab, (a.max_response_len,), generator=gen).tolist()
                group.append(
                    Sample(
                        prompt=row["prompt"], tokens=prompt + response, response_length=len(response),
                        label=row["label"], reward=float(torch.rand((), generator=gen) < 0.5),
                        loss_mask=[1] * len(response), rollout_log_probs=[-6.0] * len(response),
                        status=Status.TRUNCATED, group_index=g, index=g * a.n_samples_per_prompt + k, weight_version=0,
                    )
                )  # fmt: skip
            groups.append(group)
        return build_train_data(groups)

    def actor_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.model)

    def train(self) -> dict[str, float]:
        """Section 3; returns the figures "train" (TrainActor's train time / bare Megatron step) and "logprob"
        (its log-prob phase / bare no-grad forward), each the median of per-repeat ratios."""
        import torch
        from megatron.core.distributed import finalize_model_grads

        from slime_like.trainer.megatron.cpu_compat import cuda_to_cpu
        from slime_like.trainer.megatron.packing import pack, split_micro_batches

        a = self.args
        print("\n== 3. Train step vs bare Megatron step (one process, a world of one) ==", flush=True)
        engine = self.actor.engine
        data = self.train_data()
        tokens = data.tokens
        lengths = [len(t) for t in tokens]
        n_loss = sum(sum(m) for m in data.loss_masks)
        # The micro-batches the engine packs (world of one), built once: the bare step does not pack.
        plan = split_micro_batches(range(len(tokens)), lengths, a.max_tokens_per_gpu)
        micro = [pack(tokens, ids) for ids in plan]
        targets = [torch.roll(mb.tokens, -1, dims=1) for mb in micro]
        masks = []
        for mb in micro:
            m = torch.zeros(mb.tokens.shape)
            for row, start, length, idx in zip(mb.rows, mb.starts, mb.lengths, mb.indices, strict=True):
                n = data.response_lengths[idx]
                m[row, start + length - 1 - n : start + length - 1] = 1.0  # positions that predict the response
            masks.append(m)
        print(
            f"batch: {len(tokens)} sequences, {sum(lengths)} tokens, {len(micro)} packed micro-batches of <= "
            f"{a.max_tokens_per_gpu} tokens, one optimizer step; {a.train_repeats} measured repeats per variant "
            "after 2 warm-ups, rotating order",
            flush=True,
        )
        chunk = engine.model[0]
        rollout_id = iter(range(10**6))
        actor_times: dict[str, list[float]] = {"time/logprob": [], "time/train": []}

        def actor_train() -> None:  # log-prob recompute + advantages + the optimizer step
            metrics = self.actor.train(next(rollout_id), data)
            for key, values in actor_times.items():
                values.append(metrics[key])

        def plain_loss(logprobs, items, **_):
            return -sum(lp[-n:].sum() for lp, n in zip(logprobs, items, strict=True)) / n_loss

        def engine_plain() -> None:  # the engine's train_step with the bare step's loss and no entropy
            engine.train_step(tokens, data.response_lengths, plain_loss)

        def bare_step() -> None:
            chunk.train()
            chunk.zero_grad_buffer()
            engine.optimizer.zero_grad()
            for mb, tgt, m in zip(micro, targets, masks, strict=True):
                logits = chunk(mb.tokens, mb.position_ids, mb.attention_mask)
                lp = torch.log_softmax(logits.float(), dim=-1).gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
                (-(lp * m).sum() / n_loss).backward()
            finalize_model_grads([chunk])
            with cuda_to_cpu():
                engine.optimizer.step()

        def engine_forward() -> None:
            engine.forward_logprobs(tokens)

        def bare_forward() -> None:
            chunk.eval()
            with torch.no_grad():
                for mb, tgt in zip(micro, targets, strict=True):
                    logits = chunk(mb.tokens, mb.position_ids, mb.attention_mask)
                    torch.log_softmax(logits.float(), dim=-1).gather(-1, tgt.unsqueeze(-1))

        variants = {
            "TrainActor.train (whole)": actor_train,
            "engine.train_step, plain loss": engine_plain,
            "bare Megatron step": bare_step,
            "engine.forward_logprobs": engine_forward,
            "bare no-grad forward": bare_forward,
        }
        names = list(variants)
        times: dict[str, list[float]] = {k: [] for k in names}
        for rep in range(a.train_repeats + 2):
            if rep == 2:
                for values in actor_times.values():
                    values.clear()
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                start = time.perf_counter()
                variants[name]()
                if rep >= 2:
                    times[name].append(time.perf_counter() - start)
        med = {k: median(v) for k, v in times.items()}
        med["  of which time/logprob"] = median(actor_times["time/logprob"])
        med["  of which time/train"] = median(actor_times["time/train"])
        bare, bare_fwd = med["bare Megatron step"], med["bare no-grad forward"]
        order = [names[0], "  of which time/logprob", "  of which time/train", *names[1:]]
        refs = {
            "  of which time/logprob": bare_fwd,
            "engine.forward_logprobs": bare_fwd,
            "bare no-grad forward": bare_fwd,
        }
        for name in order:
            spread = f"[{min(times[name]) * 1e3:.0f}-{max(times[name]) * 1e3:.0f}]" if name in times else ""
            ref = refs.get(name, bare)
            rel = f"x{med[name] / ref:.3f} of bare {'forward' if ref is bare_fwd else 'step'}"
            if name == names[0]:
                rel = ""
            print(f"  {name:<32}{med[name] * 1e3:8.1f} ms {spread:>12}  {rel}")
        ratio = median([t / b for t, b in zip(actor_times["time/train"], times["bare Megatron step"], strict=True)])
        print(
            f"  TrainActor time/train (train_step with the project's loss and entropy) / bare step: median of "
            f"per-repeat ratios {ratio:.3f} (the figure; goal <= 1.10)"
        )
        print(
            f"  engine.train_step with the bare loss / bare step = {med[names[1]] / bare:.3f} (engine overhead alone)"
        )
        per_repeat = zip(actor_times["time/logprob"], times["bare no-grad forward"], strict=True)
        logprob = median([t / b for t, b in per_repeat])
        print(
            f"  TrainActor time/logprob (old log-probs, advantages, metrics) / bare no-grad forward: median of "
            f"per-repeat ratios {logprob:.3f} (the figure; goal <= 1.10); engine.forward_logprobs alone "
            f"{med['engine.forward_logprobs'] / bare_fwd:.3f}"
        )
        self.attribute(engine, tokens, data)
        return {"train": ratio, "logprob": logprob}

    def attribute(self, engine: Any, tokens: list[list[int]], data: Any) -> None:
        """Time pieces of the engine's overhead on their own (medians of 5)."""
        import torch

        from slime_like.trainer.megatron.packing import pack, split_micro_batches
        from slime_like.trainer.megatron.parallel import share_from_last_stage

        lengths = [len(t) for t in tokens]

        def packing() -> None:
            for ids in split_micro_batches(range(len(tokens)), lengths, self.args.max_tokens_per_gpu):
                pack(tokens, ids)

        outputs = {i: (torch.randn(n - 1), None) for i, n in enumerate(lengths)}

        def share() -> None:
            share_from_last_stage(outputs, lambda parts: {i: v for part in parts for i, v in part.items()})

        actor = self.actor
        rank_share = actor._own_share(data)
        forwards, _ = actor._forwards(rank_share)

        def rl_batch() -> None:
            actor.step.rl_batch(rank_share, forwards)

        pieces = {
            "packing the batch (pack, all micro-batches)": packing,
            f"share_from_last_stage of {len(tokens)} log-prob tensors": share,
            "the RL step's batch (rl_batch: advantages, metrics)": rl_batch,
        }
        print("  pieces of the overhead, timed alone:")
        for name, fn in pieces.items():
            samples = []
            for _ in range(5):
                start = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - start)
            print(f"    {name:<52}{median(samples) * 1e3:7.1f} ms")

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
        model = prepare(work, args)
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
