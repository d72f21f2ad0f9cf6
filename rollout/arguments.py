"""Flags of rollout: SGLang servers, sampling, reward, plugins."""

from __future__ import annotations

import argparse


def add_rollout_arguments(parser: argparse.ArgumentParser) -> None:
    """Rollout, SGLang and reward flags (unknown `--sglang-X` flags are passed to SGLang as `--X`)."""
    g = parser.add_argument_group("rollout")
    g.add_argument("--rollout-num-gpus", type=int, default=1, help="devices for rollout (SGLang servers on CPU)")
    g.add_argument("--rollout-num-gpus-per-engine", type=int, default=1, help="SGLang tensor parallel size")
    g.add_argument("--rollout-temperature", type=float, default=1.0)
    g.add_argument("--rollout-top-p", type=float, default=1.0)
    g.add_argument("--rollout-top-k", type=int, default=-1)
    g.add_argument("--rollout-max-response-len", type=int, default=1024)
    g.add_argument("--rollout-stop", nargs="*", default=None, help="stop strings")
    g.add_argument("--rollout-stop-token-ids", nargs="*", type=int, default=None)
    g.add_argument("--sglang-server-concurrency", type=int, default=64, help="in-flight requests per server")
    g.add_argument("--rollout-request-timeout", type=float, default=600.0, help="seconds per /generate request")
    g.add_argument(
        "--custom-generate-function-path", default=None, help="async (ctx, sample, sampling_params) -> Sample"
    )
    g.add_argument("--sglang-startup-timeout", type=float, default=180.0)
    r = parser.add_argument_group("reward")
    r.add_argument("--rm-type", default="math", help="built-in reward: math | exact")
    r.add_argument("--custom-rm-path", default=None, help="(args, sample) -> reward, sync or async")
    r.add_argument("--reward-key", default=None, help="key of the training reward when rewards are dicts")
    e = parser.add_argument_group("eval")
    e.add_argument("--eval-prompt-data", default=None, help="jsonl/parquet of eval prompts (same keys)")
    e.add_argument("--eval-interval", type=int, default=None, help="evaluate every N rollouts (and before the first)")
    e.add_argument("--eval-temperature", type=float, default=0.0)
    e.add_argument("--eval-max-response-len", type=int, default=None)


def sglang_passthrough(unknown: list[str]) -> tuple[list[str], list[str]]:
    """Split leftover flags into SGLang server args (`--sglang-X v` -> `--X v`) and the rest."""
    server_args: list[str] = []
    rest: list[str] = []
    target = rest
    for token in unknown:
        if token.startswith("--sglang-"):
            target = server_args
            token = "--" + token[len("--sglang-") :]
        elif token.startswith("--"):
            target = rest
        target.append(token)  # a value goes with the flag before it
    return server_args, rest
