"""math-verify answer checking (boxed answers first); runs inside rollout.reward_worker processes.

math-verify's own timeouts use `signal.alarm` (main thread only): they are turned off here
(`parsing_timeout=None`, `timeout_seconds=None`) and the worker pool kills a call that runs too long.
"""

from __future__ import annotations

from typing import Any

TARGET = "rollout.rm_hub.math_verify_rm:score"


def score(response: str, label: Any) -> float:
    """1.0 when the response's final answer (a \\boxed{} first) is mathematically equal to the label, else 0.0."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    from math_verify.parser import NormalizationConfig

    golds = label if isinstance(label, list | tuple) else [label]
    latex = LatexExtractionConfig(
        boxed_match_priority=0,  # a \boxed{} answer wins over any other expression in the text
        normalization_config=NormalizationConfig(
            basic_latex=True, units=True, malformed_operators=False, nits=True, boxed="all", equations=True
        ),
    )
    pred = parse(response, extraction_config=[latex, ExprExtractionConfig()], parsing_timeout=None)
    if not pred:
        return 0.0
    for gold in golds:
        text = str(gold)
        parsed = parse(text if "\\boxed" in text else f"\\boxed{{{text}}}", parsing_timeout=None) or parse(
            text, parsing_timeout=None
        )
        if parsed and verify(parsed, pred, timeout_seconds=None):
            return 1.0
    return 0.0
