"""Branch selection of the OpenAI endpoint's sessions (rollout/openai_endpoint.py): which branch a prompt continues,
forks copying exactly the state after the turn they continue, and text-part content."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rollout.openai_endpoint import ChatSession, EndpointError, OpenAIEndpoint, Turn, _plain_messages


def two_turns() -> ChatSession:
    """A session with prompt [1, 2], turn 1 sampling [3, 4], inserted [5], turn 2 sampling [6]."""
    s = ChatSession("7-abc", 7, {}, 100, tokens=[1, 2], prompt_length=2)
    s.append([3, 4], "ab", [-0.5, -0.25], None)
    s.turns.append(Turn([1, 2], [3, 4], [-0.5, -0.25], "stop"))
    s.rendered, s.bridge = "P ab", "\n"
    s.mark()
    s.append([5], "\nU ", None, None)
    s.append([6], "c", [-1.0], None)
    s.turns.append(Turn([1, 2, 3, 4, 5], [6], [-1.0], "stop"))
    s.rendered, s.bridge = "P ab\nU c", "\n"
    s.mark()
    return s


def test_a_fork_copies_the_state_after_the_turn_it_continues() -> None:
    endpoint = OpenAIEndpoint.__new__(OpenAIEndpoint)  # branch_for needs only sessions and a counter
    endpoint.sessions, counts = {}, {}
    endpoint.ctx = SimpleNamespace(count=lambda key, n=1: counts.__setitem__(key, counts.get(key, 0) + n))
    main = two_turns()
    branches = [main]
    assert endpoint.branch_for(branches, "P ab\nU c\nU more") is main  # continues the last turn: no fork
    assert endpoint.branch_for(branches, "Q other") is None  # continues nothing: a fresh branch
    fork = endpoint.branch_for(branches, "P ab\nV again")  # continues turn 1 differently
    assert fork is not main and branches == [main, fork] and endpoint.sessions == {fork.id: fork}
    assert fork.tokens == [1, 2, 3, 4] and fork.loss_mask == [1, 1] and fork.log_probs == [-0.5, -0.25]
    assert fork.turns == main.turns[:1] and fork.turns[0] is main.turns[0] and fork.texts == ["ab"]
    assert (fork.rendered, fork.bridge, fork.inherited, fork.prompt_length) == ("P ab", "\n", 2, 2)
    assert main.tokens == [1, 2, 3, 4, 5, 6] and counts == {"openai_branches": 1}  # the original is untouched
    # The longest match wins: the fork's own turn 1 ties with main's; a prompt past main's turn 2 goes to main.
    assert endpoint.branch_for(branches, "P ab\nU c\nU x") is main
    main.lock._locked = True  # a turn of main in flight: a second continuation of its last turn forks
    busy = endpoint.branch_for(branches, "P ab\nU c\nU y")
    assert busy not in (main, fork) and busy.tokens == main.tokens and busy.inherited == 4


def test_text_parts_are_joined_and_other_parts_refused() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert _plain_messages([{"role": "user", "content": parts}, {"role": "assistant"}]) == [
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": ""},
    ]
    with pytest.raises(EndpointError, match="image_url"):
        _plain_messages([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
