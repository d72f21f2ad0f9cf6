"""Throughput of agents through the OpenAI-compatible endpoint vs the native generate function, same job.

    .venv/bin/python scripts/bench/bench_openai_endpoint.py              # ~3 min on 2 cores
    .venv/bin/python scripts/bench/bench_openai_endpoint.py --turns 3 --rounds 5

One SGLang server behind sglang-router serves the demo's tiny Qwen3 (scripts/bench/bench_loop.py's `prepare`).
Each round generates the same samples two ways, in alternating order: `rollout.generate.generate` (native: one
/generate per turn, the prompt's chat template rendered by the rollout) and an agent written with the OpenAI SDK
talking to `rollout/openai_endpoint.py` through `plugins.openai_agent.run_openai_agent` (per turn: an HTTP call
to the endpoint, the template rendered and the new text tokenised, then the same /generate), its client made by
`plugins.openai_agent.openai_client` (the endpoint's shared connection pool), and, as a third path, by a plain
`openai.AsyncOpenAI` per sample (which builds an SSL context each time). With --turns > 1
both continue the conversation with a fixed user turn. `ignore_eos` makes both generate exactly --gen-tokens per
turn. The figure is the median over rounds of endpoint tokens/s over native tokens/s; goal >= 0.9.
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
from bench_loop import REPO, median, prepare, prompt_rows  # noqa: E402

sys.path.insert(0, str(REPO))
GOAL = 0.9
NEXT_TURN = "go on"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the benchmark."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=64, help="samples per round (8 prompts x 8)")
    p.add_argument("--gen-tokens", type=int, default=32, help="tokens generated per turn")
    p.add_argument("--turns", type=int, default=1, help="assistant turns per sample")
    p.add_argument("--rounds", type=int, default=4, help="timed rounds per path, after one warm-up each")
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


async def _endpoint(ctx: Any, messages: list[list[dict]], params: dict, turns: int, own_client: bool) -> int:
    """Each sample's turns by an OpenAI SDK agent through the rollout's endpoint; the agent's client on the
    endpoint's shared pool (plugins.openai_agent.openai_client), or a new `openai.AsyncOpenAI` of its own."""
    import openai

    from plugins.openai_agent import openai_client, run_openai_agent
    from slime_like.core.sample import Sample

    async def agent(base_url: str, api_key: str, sample: Sample) -> None:
        make = openai.AsyncOpenAI if own_client else openai_client
        async with make(base_url=base_url, api_key=api_key, max_retries=0) as client:
            chat = list(sample.prompt)
            for _ in range(turns):
                reply = await client.chat.completions.create(
                    model="policy", messages=chat, max_tokens=params["max_new_tokens"], extra_body={"ignore_eos": True}
                )
                chat += [{"role": "assistant", "content": reply.choices[0].message.content}]
                chat += [{"role": "user", "content": NEXT_TURN}]

    samples = [Sample(prompt=m, index=i) for i, m in enumerate(messages)]
    budget = {**params, "max_new_tokens": turns * params["max_new_tokens"] * 4}  # the whole conversation's room
    await asyncio.gather(*(run_openai_agent(ctx, s, budget, agent, timeout=600) for s in samples))
    failed = [s.metadata.get("agent_error") for s in samples if s.status.value == "failed"]
    if failed:
        raise RuntimeError(f"{len(failed)} agents failed, e.g. {failed[0]}")
    return sum(sum(s.loss_mask) for s in samples)  # the model's tokens only


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
        start = time.perf_counter()
        if path == "native":
            tokens = await _native(ctx, messages, params, args.turns)
        else:
            tokens = await _endpoint(ctx, messages, params, args.turns, own_client=path == "endpoint, own client")
        return tokens, time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    """Run both paths round by round and print tokens/s and the ratio."""
    args = parse_args(argv)
    from transformers import AutoTokenizer

    from rollout.router import SGLangRouter
    from rollout.sglang_server import SGLangServer
    from slime_like.arguments import parse_args as parse_run_args

    work = Path(tempfile.mkdtemp(prefix="bench-openai-"))
    args.rollout_batch_size = args.samples  # prepare/prompt_rows read these
    server = router = None
    try:
        model = prepare(work, args)
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
        paths = ["native", "endpoint", "endpoint, own client"]
        results: dict[str, list[float]] = {p: [] for p in paths}
        for p in paths:
            asyncio.run(_round(p, run_args, tokenizer, router.url, messages, args))
        for r in range(args.rounds):
            for p in paths[r % len(paths) :] + paths[: r % len(paths)]:
                tokens, elapsed = asyncio.run(_round(p, run_args, tokenizer, router.url, messages, args))
                if tokens != args.samples * args.turns * args.gen_tokens:
                    raise RuntimeError(f"{p}: {tokens} tokens, expected {args.samples * args.turns * args.gen_tokens}")
                results[p].append(tokens / elapsed)
        for p in paths:
            print(f"  {p:<22}{median(results[p]):8.0f} tok/s  (rounds: {' '.join(f'{v:.0f}' for v in results[p])})")
        for p in paths[1:]:
            ratio = median([e / n for e, n in zip(results[p], results["native"], strict=True)])
            print(f"  {p} / native: median of per-round ratios {ratio:.3f}", end="")
            print(f" (the figure, goal >= {GOAL}): {'PASS' if ratio >= GOAL else 'MISS'}" if p == "endpoint" else "")
    finally:
        if router is not None:
            router.stop()
        if server is not None:
            server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
