"""A verifiers environment serving the rollout, in its own process and venv (.venv-verifiers: verifiers needs a
newer openai than SGLang allows, scripts/setup-verifiers.sh). plugins/verifiers_env.py starts it and talks to it.

    .venv-verifiers/bin/python -m plugins.verifiers_worker ENV_ID [--env-args JSON]                 # serve rollouts
    .venv-verifiers/bin/python -m plugins.verifiers_worker ENV_ID --dump-dataset data.jsonl [--n N] # its prompts

ENV_ID is what verifiers' `load_environment` takes: an installed environment package or an importable module with a
`load_environment(**env_args)`. Serving reads one JSON object per line on stdin, {"id", "base_url", "api_key",
"model", "sampling_args", "prompt", "answer", "info", "example_id"}, runs that rollout with the environment (its
own turns, tools and rubric: `Environment.run_rollout`) against the OpenAI-compatible `base_url`, and writes one
line per rollout on stdout as it finishes: {"id", "reward", "metrics", "stop", "error"}. The first line out is
{"ready": ...} once the environment has loaded, or {"fatal": ...} before the process exits. The dataset dump
writes our prompt data: {"prompt": messages, "label": answer, "metadata": {"example_id", "info"}} per row.

This module runs where slime_like is not installed: it imports only the standard library, verifiers and openai.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any, TextIO


def _write(out: TextIO, message: dict[str, Any]) -> None:
    out.write(json.dumps(message, default=str) + "\n")
    out.flush()


async def _rollout(env: Any, request: dict[str, Any]) -> dict[str, Any]:
    """One rollout of the environment against the request's endpoint session: its reward, metrics and stop."""
    import verifiers as vf
    from openai import AsyncOpenAI

    oai = AsyncOpenAI(base_url=request["base_url"], api_key=request["api_key"], max_retries=0)
    task = {
        "prompt": request["prompt"],
        "example_id": request.get("example_id", 0),
        "answer": request.get("answer") or "",
        "info": request.get("info") or {},
    }
    try:
        out = await env.run_rollout(
            task, vf.OpenAIChatCompletionsClient(oai), request["model"], request["sampling_args"]
        )
    finally:
        await oai.close()
    error = out.get("error")
    return {
        "id": request["id"],
        "reward": out.get("reward"),
        "metrics": {k: float(v) for k, v in (out.get("metrics") or {}).items()},
        "stop": out.get("stop_condition"),
        "error": None if error is None else str(error),
    }


async def _serve(env: Any, out: TextIO) -> None:
    """Rollouts from stdin, concurrently, until stdin closes (the rollout's process went away)."""
    loop = asyncio.get_running_loop()
    running: set[asyncio.Task] = set()

    async def one(request: dict[str, Any]) -> None:
        try:
            result = await _rollout(env, request)
        except Exception as exc:  # the rollout's failure is its sample's: the worker serves on
            result = {"id": request.get("id"), "error": f"{type(exc).__name__}: {exc}"}
        _write(out, result)

    while line := await loop.run_in_executor(None, sys.stdin.readline):
        task = asyncio.create_task(one(json.loads(line)))
        running.add(task)
        task.add_done_callback(running.discard)
    for task in running:
        task.cancel()


def _dump(env: Any, path: str, n: int) -> None:
    """The environment's dataset as our prompt data (jsonl)."""
    with open(path, "w") as f:
        for row in env.get_dataset(n):
            metadata = {"example_id": row.get("example_id"), "info": row.get("info") or {}}
            f.write(json.dumps({"prompt": row["prompt"], "label": row.get("answer", ""), "metadata": metadata}) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Load the environment, then serve rollouts or dump its dataset."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("env_id")
    parser.add_argument("--env-args", default="{}", help="JSON keyword arguments of load_environment")
    parser.add_argument("--dump-dataset", default=None, help="write the dataset as prompt data (jsonl) and exit")
    parser.add_argument("--n", type=int, default=-1, help="rows to dump (default: all)")
    args = parser.parse_args(argv)
    # The protocol gets its own copy of stdout; everything else written to stdout (prints, progress bars, a C
    # library's output) goes to stderr.
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        import verifiers as vf

        env = vf.load_environment(args.env_id, **json.loads(args.env_args))
    except Exception as exc:
        _write(out, {"fatal": f"cannot load verifiers environment {args.env_id!r}: {type(exc).__name__}: {exc}"})
        return 1
    if args.dump_dataset:
        _dump(env, args.dump_dataset, args.n)
        return 0
    _write(out, {"ready": True, "env": args.env_id, "verifiers": getattr(vf, "__version__", "?")})
    asyncio.run(_serve(env, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
