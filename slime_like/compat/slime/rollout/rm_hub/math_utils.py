"""slime.rollout.rm_hub.math_utils: boxed-answer extraction and grading (our MATH normalisation, no sympy)."""

from __future__ import annotations

from slime.rollout.rm_hub.deepscaler import grade_answer_mathd

from rollout.rm_hub.boxed import last_boxed


def last_boxed_only_string(text: str) -> str | None:
    """The last `\\boxed{...}` with its wrapper, or None."""
    inner = last_boxed(text)
    return None if inner is None else "\\boxed{" + inner + "}"


def remove_boxed(text: str) -> str:
    """The content of a `\\boxed{...}` string (the string itself when it is not one)."""
    inner = last_boxed(text)
    return text if inner is None else inner


def extract_answer(passage: str) -> str | None:
    """The last boxed answer in a passage, or None."""
    return last_boxed(passage)


extract_boxed_answer = extract_answer


def grade_answer_verl(solution_str: str, ground_truth: str) -> bool:
    """Whether the solution's last boxed answer equals the ground truth (boxed or not), MATH-normalised."""
    given = last_boxed(solution_str)
    if given is None:
        return False
    return grade_answer_mathd(given, last_boxed(str(ground_truth)) or str(ground_truth))
