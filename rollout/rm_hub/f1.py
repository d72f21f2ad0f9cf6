"""Token-level F1 between the extracted answer and the label (SQuAD normalisation), for short answers."""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Any

from rollout.rm_hub.boxed import last_boxed

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)


def normalize_text(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(_ARTICLES.sub(" ", text).split())


def extract_short_answer(response: str) -> str:
    """The last <answer>...</answer>, else the last \\boxed{...}, else the text after 'Answer:', else everything."""
    tags = _ANSWER_TAG.findall(response)
    if tags:
        return tags[-1]
    boxed = last_boxed(response)
    if boxed is not None:
        return boxed
    return response.rsplit("Answer:", 1)[1] if "Answer:" in response else response


def f1_score(prediction: str, gold: str) -> float:
    """Harmonic mean of token precision and recall after normalisation."""
    pred, ref = normalize_text(prediction).split(), normalize_text(gold).split()
    common = sum((Counter(pred) & Counter(ref)).values())
    if not pred or not ref or common == 0:
        return float(pred == ref)
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def f1_reward(response: str, label: Any) -> float:
    """Best F1 of the extracted answer against the label (or any label of a list)."""
    golds = [str(g) for g in label] if isinstance(label, list | tuple) else [str(label)]
    answer = extract_short_answer(response)
    return max(f1_score(answer, g) for g in golds)
