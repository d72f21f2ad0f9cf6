"""How the endpoint closes a sampled turn before the next one (rollout.openai_session.bridge_text)."""

from __future__ import annotations

from rollout.openai_session import bridge_text

END = "<|im_end|>\n"
PROMPT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_an_output_ending_with_eos_is_closed_by_the_rest_of_the_turn() -> None:
    assert bridge_text(PROMPT, PROMPT + "hello" + END, "hello<|im_end|>", END) == ("\n", False)


def test_an_output_cut_by_the_budget_gets_the_whole_end_of_turn() -> None:
    assert bridge_text(PROMPT, PROMPT + "hel" + END, "hel", END) == (END, False)


def test_a_turn_the_template_shows_differently_keeps_the_sampled_text_and_closes_it() -> None:
    # e.g. a template that drops the reasoning of earlier turns: the sampled text is not what it prints.
    shown = PROMPT + "hello" + END
    assert bridge_text(PROMPT, shown, "<think>x</think>hello<|im_end|>", END) == ("\n", True)
    assert bridge_text(PROMPT, shown, "<think>x</think>hel", END) == (END, True)
