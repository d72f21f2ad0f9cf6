"""slime's `gpqa` reward: 1 when a multiple-choice answer picks the right letter (or quotes the right choice), else 0.

The rules are slime's (slime/rollout/rm_hub/gpqa.py), step for step: the letters are metadata['valid_letters'], else
A.. for each of metadata['choices'], else A-J; the right letter is metadata['correct_letter'], else a one-letter
label, else the label as a choice index, else the letter of the choice whose text equals the label. The answer's
letter is taken after any `</think>` ("answer is X", "X is correct", "final answer: X", else the last capital
letter standing alone). Without both letters, the response scores 1 when it contains the right choice's text.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable
from typing import Any

DEFAULT_LETTERS = list(string.ascii_uppercase[:10])
_PATTERNS = (
    r"(?:answer|option|choice)\s*(?:is|:)?\s*([A-Z])",
    r"([A-Z])\s*(?:is\s*(?:the)?\s*correct)",
    r"final\s*(?:answer|option)\s*(?:is|:)?\s*([A-Z])",
)


def _after_thinking(text: str) -> str:
    """The text after the last `</think>` (all of it without one)."""
    return text.rsplit("</think>", 1)[-1] if text else ""


def _normalize(text: str) -> str:
    """Lower case, runs of anything but letters and digits made one space."""
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()


def answer_letter(response: str, letters: Iterable[str]) -> str | None:
    """The option letter the response picks, by slime's patterns, else its last valid standalone capital letter."""
    text = _after_thinking(response)
    valid = {letter.upper() for letter in letters}
    for pattern in _PATTERNS:
        match = re.search(pattern, text, flags=re.IGNORECASE)
        if match and match.group(1).upper() in valid:
            return match.group(1).upper()
    for letter in reversed(re.findall(r"\b([A-Z])\b", text)):
        if letter in valid:
            return letter
    return None


def _choices(metadata: dict[str, Any]) -> list[Any] | None:
    """metadata['choices'] as a list (a dict gives its values)."""
    choices = metadata.get("choices")
    if isinstance(choices, dict):
        return list(choices.values())
    return None if choices is None else list(choices)


def gpqa_reward(response: str | None, label: Any, metadata: dict[str, Any] | None = None) -> float:
    """slime's compute_gpqa_reward (the module docstring says how)."""
    if response is None:
        return 0.0
    metadata = dict(metadata or {})
    choices = _choices(metadata)
    given = metadata.get("valid_letters")
    letters = [str(x).upper() for x in given] if given else DEFAULT_LETTERS
    if not given and choices:
        letters = list(string.ascii_uppercase[: len(choices)])
    correct = metadata.get("correct_letter")
    correct = correct.strip().upper() if isinstance(correct, str) else None
    label_text = None
    if isinstance(label, str):
        label_text = label.strip()
        if len(label_text) == 1 and label_text.upper() in letters and not correct:
            correct = label_text.upper()
    elif isinstance(label, int | float) and 0 <= int(label) < len(letters):
        correct = letters[int(label)]
    if not correct and choices and label_text:
        for i, choice in enumerate(choices):
            if _normalize(str(choice)) == _normalize(label_text):
                correct = letters[i]
                metadata.setdefault("correct_answer", choice)
                break
    picked = answer_letter(response, letters)
    if picked and correct:
        return 1.0 if picked == correct else 0.0
    targets = []
    if correct and choices and correct in letters and letters.index(correct) < len(choices):
        targets.append(str(choices[letters.index(correct)]))
    targets += [str(metadata[k]) for k in ("correct_answer", "answer_text") if metadata.get(k)]
    if label_text:
        targets.append(label_text)
    said = _normalize(_after_thinking(response))
    if any(t and t in said for t in {_normalize(x) for x in targets if x}):
        return 1.0
    if picked and not correct and label_text:
        return 1.0 if picked == label_text.upper() else 0.0
    return 0.0
