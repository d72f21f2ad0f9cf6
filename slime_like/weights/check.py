"""The post-update check: a few log-probs of a fixed probe sequence, trainer against every server.

Both sides score the same tokens at temperature 1 (SGLang's prompt log-probs are not temperature
scaled); a maximum absolute difference above the tolerance means a server does not hold the trainer's
weights, and raises WeightUpdateError naming the server and the difference.
"""

from __future__ import annotations

from typing import Any

import torch

from rollout import sglang_client as client
from slime_like.core.errors import EngineError, WeightUpdateError
from slime_like.weights.updater import share_from_rank0

PROBE_LENGTH = 24


def probe_tokens(vocab_size: int, length: int = PROBE_LENGTH, seed: int = 0) -> list[int]:
    """A fixed pseudo-random token sequence (the same on every rank and every update)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (length,), generator=g).tolist()


def served_logprobs(url: str, tokens: list[int], timeout: float = 60.0) -> torch.Tensor:
    """The server's log-prob of every token after the first."""
    try:
        return torch.tensor(client.prompt_logprobs(url, tokens, timeout), dtype=torch.float32)
    except EngineError as exc:
        raise WeightUpdateError(f"the weight check's probe failed: {exc}") from exc


def trainer_logprobs(engine: Any, tokens: list[int]) -> torch.Tensor:
    """The engine's log-probs of the probe at temperature 1 (a collective: every trainer rank calls it)."""
    temperature, engine.temperature = engine.temperature, 1.0
    try:
        return engine.forward_logprobs([tokens])[0].float()
    finally:
        engine.temperature = temperature


def check_servers(engine: Any, server_urls: list[str], tolerance: float, rank: int, version: int) -> float:
    """Compare the probe's log-probs on every server with the trainer's; return the largest difference."""
    tokens = probe_tokens(engine.bridge.hf_config.vocab_size)
    expected = trainer_logprobs(engine, tokens)
    verdict: tuple[float, str | None] = (0.0, None)
    if rank == 0:
        worst, problem = 0.0, None
        for url in server_urls:
            try:
                diff = float((served_logprobs(url, tokens) - expected).abs().max())
            except WeightUpdateError as exc:
                worst, problem = float("inf"), str(exc)
                break
            worst = max(worst, diff)
            if diff > tolerance and problem is None:
                problem = (
                    f"after the update to version {version}, {url} differs from the trainer by {diff:.3g} in "
                    f"log-prob (tolerance {tolerance:g}, --check-weight-update-tolerance)"
                )
        verdict = (worst, problem)
    worst, problem = share_from_rank0(verdict)
    if problem is not None:
        raise WeightUpdateError(problem)
    return worst
