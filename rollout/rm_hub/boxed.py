"""Strict boxed-answer scorers: DAPO's (+1 / -1 on the last 300 characters) and DeepScaleR's (1 / 0)."""

from __future__ import annotations

import re
from typing import Any

# Minerva-style normalisation, as in the DAPO reference scorer.
_SUBSTITUTIONS = [
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""), ("mbox", "text"),
    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
]  # fmt: skip
_REMOVED = [
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue", "points",
    "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals", "edges", "students",
    "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3",
    "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;", r",\!", "{,}", '"', "\\dots",
]  # fmt: skip


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (nested braces allowed) or `\\boxed x`; None if there is none."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    rest = text[start:]
    after = rest[len("\\boxed") :] if rest.startswith("\\boxed") else rest[len("\\fbox") :]
    if after.startswith(" "):  # "\\boxed 5"
        return after[1:].split("$")[0].strip() or None
    if not after.startswith("{"):
        return None
    depth = 0
    for i, ch in enumerate(after):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth == 0:
            return after[1:i]
    return None  # unbalanced: the answer was cut off


def normalize_final_answer(answer: str) -> str:
    """Minerva/DAPO normalisation of a final answer string."""
    answer = answer.split("=")[-1]
    for before, after in _SUBSTITUTIONS:
        answer = answer.replace(before, after)
    for expr in _REMOVED:
        answer = answer.replace(expr, "")
    answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", answer)
    answer = re.sub(r"(\\text\{)(.*?)(\})", "\\2", answer)
    answer = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", answer)
    answer = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", answer)
    answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", answer)
    answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", answer)
    answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def _labels(label: Any) -> list[str]:
    """A label may list several accepted answers."""
    return [str(x) for x in label] if isinstance(label, list | tuple) else [str(label)]


def dapo_reward(response: str, label: Any) -> float:
    """DAPO strict-box: +1 when the last boxed answer in the final 300 characters equals the label, else -1."""
    boxed = last_boxed(response[-300:])
    if boxed is None:
        return -1.0
    pred = normalize_final_answer(boxed)
    return 1.0 if any(pred == normalize_final_answer(g) for g in _labels(label)) else -1.0


def _mathd_normalize(answer: str) -> str:
    """DeepScaleR/MATH-style string normalisation (spacing, \\left/\\right, dfrac, units, trailing .0)."""
    answer = answer.strip()
    answer = re.sub(r"\\text\{\s*([^}]*)\}", r"\1", answer)
    for old, new in (("\\left", ""), ("\\right", ""), ("\\!", ""), ("dfrac", "frac"), ("tfrac", "frac")):
        answer = answer.replace(old, new)
    answer = answer.replace("^\\circ", "").replace("^{\\circ}", "").replace("\\$", "").replace("$", "")
    answer = re.sub(r"^[a-zA-Z]\s*=", "", answer)  # "x = 3" -> "3"
    answer = answer.replace(" ", "").rstrip(".")
    if re.fullmatch(r"-?\d+\.0+", answer):
        answer = answer.split(".")[0]
    if answer.replace(",", "").lstrip("-").isdigit():
        answer = answer.replace(",", "")
    return answer


def _same(pred: str, gold: str) -> bool:
    if pred == gold:
        return True
    try:
        return abs(float(pred) - float(gold)) < 1e-6
    except ValueError:
        return False


def deepscaler_reward(response: str, label: Any) -> float:
    """DeepScaleR: 1 when the last boxed answer after any `</think>` matches the label (normalised), else 0."""
    if "</think>" in response:
        response = response.rsplit("</think>", 1)[1]
    boxed = last_boxed(response)
    if boxed is None:
        return 0.0
    pred = _mathd_normalize(boxed)
    golds = [_mathd_normalize(last_boxed(g) or g) for g in _labels(label)]
    return 1.0 if any(_same(pred, g) for g in golds) else 0.0
