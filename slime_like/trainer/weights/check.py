"""The post-update check: a few log-probs of a fixed probe sequence, trainer against every server.

Both sides score the same tokens at temperature 1 (SGLang's prompt log-probs are not temperature
scaled); a maximum absolute difference above the tolerance means a server does not hold the trainer's
weights, and raises WeightUpdateError naming the server and the difference.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from rollout import sglang_client as client
from slime_like.core.errors import EngineError, WeightUpdateError
from slime_like.trainer.weights.updater import Verdict, share_from_rank0

logger = logging.getLogger(__name__)

PROBE_LENGTH = 24


def probe_tokens(vocab_size: int, length: int = PROBE_LENGTH, seed: int = 0) -> list[int]:
    """A fixed pseudo-random token sequence (the same on every rank and every update)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (length,), generator=g).tolist()


def served_logprobs(url: str, tokens: list[int], timeout: float = 60.0, lora_path: str | None = None) -> torch.Tensor:
    """The server's log-prob of every token after the first (under the LoRA adapter `lora_path` when given)."""
    try:
        return torch.tensor(client.prompt_logprobs(url, tokens, timeout, lora_path), dtype=torch.float32)
    except EngineError as exc:
        raise WeightUpdateError(f"the weight check's probe failed: {exc}") from exc


def precisions(url: str, trainer_dtype: torch.dtype) -> str:
    """Both precisions, and what to do when they differ."""
    served, trained = client.served_dtype(url), str(trainer_dtype).removeprefix("torch.")
    if served == trained:
        return f"the server and the trainer both run in {trained}: the server does not hold the trainer's weights"
    if served == "unknown":
        return f"the trainer runs in {trained}; the server did not say its precision (/get_server_info)"
    return (
        f"the server runs in {served} but the trainer in {trained}: start the servers at the trainer's precision "
        "(drop --sglang-dtype; servers started here follow --bf16)"
    )


def trainer_logprobs(engine: Any, tokens: list[int]) -> torch.Tensor:
    """The engine's log-probs of the probe at temperature 1 (a collective: every trainer rank calls it)."""
    temperature, engine.temperature = engine.temperature, 1.0
    try:
        return engine.forward_logprobs([tokens])[0].float()
    finally:
        engine.temperature = temperature


def check_servers(
    engine: Any,
    server_urls: list[str],
    tolerance: float,
    rank: int,
    when: str,
    lora_path: str | None = None,
    fleet: Verdict | None = None,
    skipped: list[str] | None = None,
) -> float:
    """Compare the probe's log-probs on every server with the trainer's; return the largest difference.

    `when` starts the error message ("after the update to version 3", "before the first rollout"), which also
    names the precision the server and the trainer run at: a server at another precision is the usual cause
    before the first rollout. With `fleet`, a server whose probe fails and that the fleet then takes out (it died
    since the update) is skipped (and added to `skipped`): it restarts before the next update.
    """
    tokens = probe_tokens(engine.bridge.hf_config.vocab_size)
    expected = trainer_logprobs(engine, tokens)
    # A LoRA trainer's policy is the base plus its adapter: the servers serve it under the adapter's name.
    # (multi-LoRA: the caller names the live adapter, lora_slots.py)
    if lora_path is None and getattr(engine, "lora", None) is not None:
        lora_path = client.LORA_ADAPTER_NAME
    verdict: tuple[float, str | None] = (0.0, None)
    if rank == 0:
        worst, problem = 0.0, None
        for url in server_urls:
            try:
                diff = float((served_logprobs(url, tokens, lora_path=lora_path) - expected).abs().max())
            except WeightUpdateError as exc:
                if fleet is not None and not _kept(fleet, url, str(exc)):
                    logger.warning("%s %s: not checked, it died since and the engine fleet took it out", when, url)
                    if skipped is not None:
                        skipped.append(url)
                    continue
                worst, problem = float("inf"), str(exc)
                break
            worst = max(worst, diff)
            if diff > tolerance and problem is None:
                problem = f"{when}, {url} differs from the trainer by {diff:.3g} in log-prob (tolerance {tolerance:g}, "
                problem += f"--check-weight-update-tolerance): {precisions(url, engine.dtype)}"
        verdict = (worst, problem)
    worst, problem = share_from_rank0(verdict)
    if problem is not None:
        raise WeightUpdateError(problem)
    return worst


def _kept(fleet: Verdict, url: str, cause: str) -> bool:
    """Whether the fleet still counts `url` alive after its probe failed (also when the fleet cannot say)."""
    try:
        return url in fleet([url], cause)
    except Exception:  # no verdict: the failure stands
        return True
