"""slime's extra rollout statistics: --log-multi-turn (response lengths with and without tool/environment tokens,
turns per sample) and --log-correct-samples (where the correct answers' lengths fall, their entropy proxy).

slime computes both on the trainer from its rollout data; here they come from the samples that train, on the
rollout side, over the whole rollout (slime averages per-rank values over the data-parallel ranks).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from slime_like.core.sample import Sample


def multi_turn_metrics(samples: list[Sample], max_response_len: int) -> dict[str, float]:
    """slime's log_multi_turn_data: response lengths (every token, and the loss tokens: without tool or environment
    output) and the samples' metadata['round_number'], under slime's names (`multi_turn/...`)."""
    if not samples:
        return {}
    raw = [float(s.response_length) for s in samples]
    own = [float(s.effective_response_length) for s in samples]
    clipped = sum(n >= max_response_len for n in raw) / len(raw)
    metrics = {
        "multi_turn/raw_response_length/response_length_mean": statistics.fmean(raw),
        "multi_turn/raw_response_length/response_length_max": max(raw),
        "multi_turn/raw_response_length/response_length_min": min(raw),
        "multi_turn/raw_response_length/response_length_clip_ratio": clipped,
        "multi_turn/wo_obs_response_length/response_length_mean": statistics.fmean(own),
        "multi_turn/wo_obs_response_length/response_length_max": max(own),
        "multi_turn/wo_obs_response_length/response_length_min": min(own),
    }
    if "round_number" in samples[0].metadata:  # as slime: the first sample says whether the generator counts turns
        rounds = [float(s.metadata["round_number"]) for s in samples]
        metrics["multi_turn/multi_turn_metric/round_number_mean"] = statistics.fmean(rounds)
        metrics["multi_turn/multi_turn_metric/round_number_max"] = max(rounds)
        metrics["multi_turn/multi_turn_metric/round_number_min"] = min(rounds)
    return metrics


def length_quartiles(max_len: int, lengths: list[int], parts: int = 4) -> dict[str, float]:
    """slime's quantile(): the share of `lengths` in each of `parts` equal slices of [0, max_len] (`p25`: at most
    a quarter of max_len, `p50`: above that and at most half, ...); a length above max_len counts in none."""
    cuts = [max_len * (i + 1) / parts for i in range(parts)]
    cuts[-1] = max_len
    counts = [0] * parts
    for n in lengths:
        for i, cut in enumerate(cuts):
            if n <= cut:
                counts[i] += 1
                break
    total = sum(counts) + 1e-9
    return {f"p{min(math.ceil((i + 1) / parts * 100), 100)}": c / total for i, c in enumerate(counts)}


def correct_sample_metrics(
    samples: list[Sample], rewards: list[float], max_response_len: int, prefix: str = "rollout"
) -> dict[str, float]:
    """slime's --log-correct-samples: of the samples whose raw reward is 1, their mean response length, the share
    per quarter of --rollout-max-response-len (`correct_length/p25`...), and `correct_entropy`: the mean over them
    of each one's mean -log p over its loss tokens (SGLang's log-probs; slime: the trainer's old-policy ones)."""
    correct = [s for s, r in zip(samples, rewards, strict=True) if r == 1]
    lengths = [s.response_length for s in correct]
    metrics = {f"{prefix}/correct_response_lengths": statistics.fmean(lengths) if lengths else 0.0}
    for name, share in length_quartiles(max_response_len, lengths).items():
        metrics[f"{prefix}/correct_length/{name}"] = share
    means = [m for m in (_mean_negative_log_prob(s) for s in correct) if m is not None]
    metrics[f"{prefix}/correct_entropy"] = statistics.fmean(means) if means else 0.0
    return metrics


def _mean_negative_log_prob(sample: Sample) -> float | None:
    """The mean -log p of the sample's loss tokens (None: no log-probs); a sample without loss tokens gives 0."""
    log_probs = sample.rollout_log_probs
    if not log_probs:
        return None
    mask: Any = sample.loss_mask if sample.loss_mask is not None else [1] * len(log_probs)
    tokens = sum(mask)
    return -sum(lp * m for lp, m in zip(log_probs, mask, strict=False)) / tokens if tokens else 0.0
