"""Throughput of agents through the OpenAI-compatible endpoint vs the native generate function, same job.

    .venv/bin/python scripts/bench/bench_openai_endpoint.py              # ~2 min on 2 cores
    .venv/bin/python scripts/bench/bench_openai_endpoint.py --turns 3 --rounds 5

One SGLang server behind sglang-router serves the demo's tiny Qwen3 (scripts/bench/bench_loop.py's `prepare`).
Each round generates the same samples on every path, in rotating order: `rollout.generate.generate` (native: one
/generate per turn, the prompt's chat template rendered by the rollout), and agents through `rollout/openai_endpoint.py`
by `plugins.openai_agent.run_openai_agent` (per turn: a call to the endpoint, the template rendered and the new text
tokenised, then the same /generate), with four clients (PATHS): the OpenAI SDK from
`plugins.openai_agent.openai_client`, answered in process (the figure); the same SDK over HTTP on the endpoint's
connection pool; no SDK, aiohttp posting the JSON over HTTP (what the endpoint itself costs); a plain
`openai.AsyncOpenAI` per sample (the SSL context shared: rollout/ssl_context.py). With --turns > 1 every path
continues the conversation with a fixed user turn, and one more path rewrites the history it sends back (each reply
with a character changed at its end, as frameworks re-serialise turns), so every turn after the first branches the
session (rollout/openai_session.py). Printed also: sessions (samples) per second. `ignore_eos` makes all generate exactly --gen-tokens per turn. Printed per path: tokens/s, the
median of per-round ratios to native (the figure: the "endpoint" row, goal >= 0.9), and this process's CPU time per
turn, which the load of a shared machine disturbs far less than wall-clock throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import REPO, median, prepare, prompt_rows  # noqa: E402

sys.path.insert(0, str(REPO))
GOAL = 0.9
# path -> the agent's client: the SDK through plugins.openai_agent.openai_client in process (the figure) or over
# HTTP on the endpoint's pool, a plain `openai.AsyncOpenAI` per sample, or no SDK (aiohttp posting the JSON).
PATHS = {"endpoint": "in-process", "endpoint, SDK over HTTP": "http", "endpoint, raw HTTP": "raw"}
PATHS["endpoint, own AsyncOpenAI"] = "own"
BRANCHING = {"endpoint, history rewritten": "rewrite"}  # with --turns > 1
NEXT_TURN = "go on"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the benchmark."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=64, help="samples per round (8 prompts x 8)")
    p.add_argument("--gen-tokens", type=int, default=32, help="tokens generated per turn")
    p.add_argument("--turns", type=int, default=1, help="assistant turns per sample")
    # 8: the median of 4 per-round ratios still moved by ~0.06 between quiet runs (scripts/bench/README.md).
    p.add_argument("--rounds", type=int, default=8, help="timed rounds per path, after one warm-up each")
    p.add_argument("--sft-steps", type=int, default=0, help="(prepare) SFT warm start steps; 0: random init")
    p.add_argument("--keep", action="store_true", help="keep the work dir")
    return p.parse_args(argv)


async def _native(ctx: Any, messages: list[list[dict]], params: dict, turns: int) -> int:
    """Each sample's turns with the native generate function: the rendered conversation as the prompt."""
    from rollout.generate import generate
    from slime_like.core.sample import Sample

    async def one(i: int, chat: list[dict]) -> int:
        made = 0
        for _ in range(turns):
            text = ctx.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
            sample = Sample(prompt=text, index=i)
            await generate(ctx, sample, dict(params))
            made += sample.response_length
            chat = [*chat, {"role": "assistant", "content": sample.response}, {"role": "user", "content": NEXT_TURN}]
        return made

    return sum(await asyncio.gather(*(one(i, m) for i, m in enumerate(messages))))


async def _endpoint(ctx: Any, messages: list[list[dict]], params: dict, turns: int, client: str) -> int:
    """Each sample's turns by an agent through the rollout's endpoint, its client one of CLIENTS."""
    import aiohttp
    import openai

    from plugins.openai_agent import openai_client, run_openai_agent
    from slime_like.core.sample import Sample

    async def sdk_agent(base_url: str, api_key: str, sample: Sample) -> None:
        if client == "own":
            sdk = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        else:
            sdk = openai_client(base_url, api_key, in_process=client in ("in-process", "rewrite"), max_retries=0)
        async with sdk:
            chat = list(sample.prompt)
            for _ in range(turns):
                reply = await sdk.chat.completions.create(
                    model="policy", messages=chat, max_tokens=params["max_new_tokens"], extra_body={"ignore_eos": True}
                )
                content = reply.choices[0].message.content or ""
                if client == "rewrite":  # the history sent back is not what was sampled: a branch each turn
                    content = content[:-1] + ("." if content[-1:] != "." else ",")
                chat += [{"role": "assistant", "content": content}]
                chat += [{"role": "user", "content": NEXT_TURN}]

    async def raw_agent(base_url: str, api_key: str, sample: Sample) -> None:
        chat, headers = list(sample.prompt), {"Authorization": f"Bearer {api_key}"}
        for _ in range(turns):
            body = {"model": "policy", "messages": chat, "max_tokens": params["max_new_tokens"], "ignore_eos": True}
            async with http.post(f"{base_url}/chat/completions", json=body, headers=headers) as r:
                reply = await r.json()
            chat += [{"role": "assistant", "content": reply["choices"][0]["message"]["content"]}]
            chat += [{"role": "user", "content": NEXT_TURN}]

    samples = [Sample(prompt=m, index=i) for i, m in enumerate(messages)]
    budget = {**params, "max_new_tokens": turns * params["max_new_tokens"] * 4}  # the whole conversation's room
    agent = raw_agent if client == "raw" else sdk_agent
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        runs = await asyncio.gather(*(run_openai_agent(ctx, s, budget, agent, timeout=600) for s in samples))
    failed = [s.metadata.get("agent_error") for s in samples if s.status.value == "failed"]
    if failed:
        raise RuntimeError(f"{len(failed)} agents failed, e.g. {failed[0]}")
    branches = [b for run in runs for b in (run if isinstance(run, list) else [run])]
    return sum(sum(s.loss_mask) for s in branches)  # the model's tokens only, each once


async def _round(path: str, run_args: Any, tokenizer: Any, url: str, messages: list, args: argparse.Namespace):
    import aiohttp

    from rollout.context import RolloutContext
    from rollout.generate import sampling_params_from_args

    params = {**sampling_params_from_args(run_args), "max_new_tokens": args.gen_tokens, "ignore_eos": True}
    conc = run_args.sglang_server_concurrency
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conc + 4)) as session:
        ctx = RolloutContext(
            run_args, tokenizer, url, session, asyncio.Semaphore(conc), loop=asyncio.get_running_loop()
        )
        start, cpu = time.perf_counter(), time.process_time()
        if path == "native":
            tokens = await _native(ctx, messages, params, args.turns)
        else:
            tokens = await _endpoint(ctx, messages, params, args.turns, {**PATHS, **BRANCHING}[path])
        return tokens, time.perf_counter() - start, time.process_time() - cpu


def main(argv: list[str] | None = None) -> None:
    """Run both paths round by round and print tokens/s and the ratio."""
    args = parse_args(argv)
    from transformers import AutoTokenizer

    from rollout.router import SGLangRouter
    from rollout.sglang_server import SGLangServer
    from slime_like.arguments import parse_args as parse_run_args

    work = Path(tempfile.mkdtemp(prefix="bench-openai-"))
    server = router = None
    try:
        model = prepare(work, args.sft_steps)
        flags = ["--hf-checkpoint", str(model), "--prompt-data", str(work / "data" / "train.jsonl")]
        flags += ["--rollout-batch-size", "1", "--num-rollout", "1", "--rollout-temperature", "1.0"]
        run_args = parse_run_args([*flags, "--output-dir", str(work / "out")])
        tokenizer = AutoTokenizer.from_pretrained(model)
        messages = [[{"role": "user", "content": r["prompt"]}] for r in prompt_rows(work, args.samples)]
        server = SGLangServer(model, log_dir=work / "logs").start()
        router = SGLangRouter([server.url], log_dir=work / "logs").start()
        print(
            f"{args.samples} samples x {args.turns} turn(s) x {args.gen_tokens} tokens (ignore_eos), one server via "
            f"the router; {args.rounds} rounds per path, alternating, after a warm-up of each",
            flush=True,
        )
        paths = ["native", *PATHS, *(BRANCHING if args.turns > 1 else [])]
        results: dict[str, list[float]] = {p: [] for p in paths}
        cpu: dict[str, list[float]] = {p: [] for p in paths}
        for p in paths:
            asyncio.run(_round(p, run_args, tokenizer, router.url, messages, args))
        calls = args.samples * args.turns
        for r in range(args.rounds):
            for p in paths[r % len(paths) :] + paths[: r % len(paths)]:
                tokens, elapsed, used = asyncio.run(_round(p, run_args, tokenizer, router.url, messages, args))
                if tokens != calls * args.gen_tokens:
                    raise RuntimeError(f"{p}: {tokens} tokens, expected {calls * args.gen_tokens}")
                results[p].append(tokens / elapsed)
                cpu[p].append(1000 * used / calls)
        print(
            f"{'path':<31}{'tok/s':>7}{'/ native':>10}{'CPU ms/turn':>13}{'sessions/s':>12}"
            "   (CPU: this process, rollout + agents + endpoint)"
        )
        per_session = args.turns * args.gen_tokens
        for p in paths:
            ratio = median([e / n for e, n in zip(results[p], results["native"], strict=True)])
            rate = median(results[p]) / per_session
            print(f"  {p:<29}{median(results[p]):7.0f}{ratio:10.3f}{median(cpu[p]):13.2f}{rate:12.1f}", end="")
            print(f"   rounds: {' '.join(f'{v:.0f}' for v in results[p])}")
        ratio = median([e / n for e, n in zip(results["endpoint"], results["native"], strict=True)])
        print(
            f"endpoint / native (median of per-round ratios): {ratio:.3f}, goal >= {GOAL}: {'PASS' if ratio >= GOAL else 'MISS'}"
        )
    finally:
        if router is not None:
            router.stop()
        if server is not None:
            server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
