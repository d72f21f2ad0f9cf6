"""slime.rollout.rm_hub.f1: token F1 (ours: rollout/rm_hub/f1.py)."""

from __future__ import annotations

from collections import Counter

from rollout.rm_hub.f1 import normalize_text


def f1_score(prediction: str, ground_truth: str) -> tuple[float, float, float]:
    """(f1, precision, recall) of normalised tokens; (0, 0, 0) without overlap."""
    pred, ref = normalize_text(prediction).split(), normalize_text(ground_truth).split()
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0, 0.0, 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall), precision, recall
