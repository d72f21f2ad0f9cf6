"""The post-update check: a few log-probs of a fixed probe sequence, trainer against every server.

Both sides score the same tokens at temperature 1 (SGLang's prompt log-probs are not temperature
scaled); a maximum absolute difference above the tolerance means a server does not hold the trainer's
weights, and raises WeightUpdateError naming the server and the difference. A vision-language model's probe starts
with a fixed image (the checkpoint's processor renders it), so the check covers its vision tower too.
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


def probe(engine: Any) -> tuple[list[int], dict[str, Any] | None, list[str] | None]:
    """The probe's tokens; for a vision-language model (engine.vision) they start with a fixed image's prompt, and
    its processor tensors (the trainer's) and image data URL (the server's) come with them (else None, None)."""
    if not getattr(engine, "vision", False):
        return probe_tokens(engine.bridge.hf_config.vocab_size), None, None
    import numpy as np
    from PIL import Image

    from buffer import multimodal as mm

    vl = engine.bridge.vl_config
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (56, 84, 3), dtype=np.uint8))
    processor = mm.load_processor(str(engine.bridge.slime_like_hf_dir))
    message = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "probe"}]}
    ids, inputs = mm.process(processor, mm.render_text(processor, [message]), [image])
    # Text after the image: ids below the vision special tokens (an image pad there would be an image without data).
    special = min(vl.image_token_id, vl.video_token_id, vl.vision_start_token_id, vl.vision_end_token_id)
    text = probe_tokens(min(special, engine.bridge.hf_config.vocab_size))
    return ids + text, inputs, [mm.image_data_url(image)]


def text_targets(engine: Any, tokens: list[int]) -> torch.Tensor:
    """Which of the probe's log-probs compare: those of text tokens (SGLang swaps an image's pad ids for the image's
    hash in its own ids, so its log-probs of the pads are of other ids)."""
    image = engine.bridge.vl_config.image_token_id
    return torch.tensor([t != image for t in tokens[1:]])


def served_logprobs(
    url: str,
    tokens: list[int],
    timeout: float = 60.0,
    lora_path: str | None = None,
    image_data: list[str] | None = None,
) -> torch.Tensor:
    """The server's log-prob of every token after the first (under the LoRA adapter `lora_path` when given; with the
    images of the probe's image pads when given)."""
    try:
        logprobs = client.prompt_logprobs(url, tokens, timeout, lora_path, image_data)
        return torch.tensor(logprobs, dtype=torch.float32)
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


def trainer_logprobs(engine: Any, tokens: list[int], images: dict[str, Any] | None = None) -> torch.Tensor:
    """The engine's log-probs of the probe at temperature 1 (a collective: every trainer rank calls it)."""
    temperature, engine.temperature = engine.temperature, 1.0
    try:
        if images is not None:
            return engine.forward_logprobs([tokens], multimodal=[images])[0].float()
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
    tokens, images, image_data = probe(engine)
    expected = trainer_logprobs(engine, tokens, images)
    compared = text_targets(engine, tokens) if images is not None else slice(None)
    # A LoRA trainer's policy is the base plus its adapter: the servers serve it under the adapter's name.
    # (multi-LoRA: the caller names the live adapter, lora_slots.py)
    if lora_path is None and getattr(engine, "lora", None) is not None:
        lora_path = client.LORA_ADAPTER_NAME
    verdict: tuple[float, str | None] = (0.0, None)
    if rank == 0:
        worst, problem = 0.0, None
        for url in server_urls:
            try:
                served = served_logprobs(url, tokens, lora_path=lora_path, image_data=image_data)
                diff = float((served - expected).abs()[compared].max())
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
