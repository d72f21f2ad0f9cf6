"""reasoning-gym task scorers; run inside rollout.reward_worker processes (some scorers use sympy)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

TARGET = "rollout.rm_hub.gym:score"


@cache
def _scorer(task: str) -> Callable[..., float]:
    import reasoning_gym

    return reasoning_gym.get_score_answer_fn(task)


def score(response: str, label: Any, metadata: dict[str, Any], question: str) -> float:
    """Score the <answer>...</answer> (else the last \\boxed{}) with the scorer of `metadata["source_dataset"]`."""
    from reasoning_gym.utils import extract_answer

    from rollout.rm_hub.boxed import last_boxed

    task = metadata.get("source_dataset")
    if not task:
        raise ValueError("--rm-type reasoning_gym needs metadata.source_dataset (the reasoning-gym task name)")
    answer = extract_answer(response) or last_boxed(response)
    if answer is None:
        return 0.0
    entry = {"question": question, "answer": label, "metadata": metadata}
    return float(_scorer(task)(answer=answer, entry=entry))
