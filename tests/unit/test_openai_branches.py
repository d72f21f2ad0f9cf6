"""Where a call goes in an agent's session (rollout/openai_session.py): the branch it extends, a fork at a turn or
at the longest token prefix it shares, or a fresh branch; what a fork copies; and text-part content.

The session here is built by hand over a character tokenizer (one id per character), so every expected token count
is the length of a string; tests/integration/test_openai_history.py runs the same routes with a real tokenizer and
SGLang."""

from __future__ import annotations

import pytest

from rollout.openai_chat import plain_messages
from rollout.openai_session import ChatSession, Conversation, EndpointError, Turn, fork_point


class Chars:
    """One token per character: ids are code points."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(map(chr, ids))


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def two_turns(sid: str = "7-abc") -> ChatSession:
    """Prompt "P:", turn 1 samples "ab", then "|U:" is inserted and turn 2 samples "cd" (bridge "|" each time)."""
    s = ChatSession(sid, 7, {}, 100, tokens=ids("P:"), prompt_length=2, prompt_text="P:")
    s.append(ids("ab"), "ab", [-0.5, -0.25], None)
    s.turns.append(Turn(ids("P:"), ids("ab"), [-0.5, -0.25], "stop"))
    s.rendered, s.bridge = "P:ab|", "|"
    s.mark()
    s.append(ids("|U:"), "|U:", None, None)
    s.append(ids("cd"), "cd", [-1.0, -2.0], None)
    s.turns.append(Turn(ids("P:ab|U:"), ids("cd"), [-1.0, -2.0], "stop"))
    s.rendered, s.bridge = "P:ab|U:cd|", "|"
    s.mark()
    return s


def conversation(strict: bool = False) -> tuple[Conversation, ChatSession]:
    main = two_turns()
    conv = Conversation("7-abc", 7, {}, 100, strict, branches=[main], last=main)
    return conv, main


def test_a_call_that_extends_the_last_turn_goes_on_in_its_branch() -> None:
    conv, main = conversation()
    route = conv.route("P:ab|U:cd|V:", Chars())
    assert route.branch is main and not route.new


def test_a_call_repeating_an_earlier_turn_forks_after_it_with_the_tokens_of_the_common_prefix() -> None:
    conv, main = conversation()
    # Turn 1 as the template shows it ("P:ab|"), then "U:" again, then new text: the fork keeps "|U:" of the
    # inserted piece, as many of its tokens as the new prompt repeats.
    route = conv.route("P:ab|U:xy|", Chars())
    fork = route.branch
    assert route.new and fork is not main and fork.id == "7-abc~1"
    assert fork.tokens == ids("P:ab|U:") and fork.loss_mask == [1, 1, 0, 0, 0]
    assert fork.log_probs == [-0.5, -0.25, 0.0, 0.0, 0.0] and fork.texts == ["ab", "|U:"]
    assert fork.turns == main.turns[:1] and fork.turns[0] is main.turns[0]
    assert (fork.rendered, fork.bridge, fork.inherited, fork.reprefill) == ("P:ab|U:", "", 5, True)
    assert main.tokens == ids("P:ab|U:cd")  # the original is untouched


def test_a_history_rewritten_inside_a_sampled_turn_keeps_the_sampled_tokens_it_repeats() -> None:
    # The agent sends turn 2's output back re-serialised: "cX" instead of "cd". The fork keeps the sampled "c"
    # (trained in the first branch) and the rest is new text.
    conv, main = conversation()
    assert fork_point(main, "P:ab|U:cX|W:", Chars()) == (len("P:ab|U:c"), 8, 2, "c")
    fork = conv.route("P:ab|U:cX|W:", Chars()).branch
    assert fork.tokens == ids("P:ab|U:c") and fork.texts == ["ab", "|U:", "c"] and fork.loss_mask[-1] == 1
    assert [n for n, _ in fork.spans] == [2, 3, 1] and fork.turns == main.turns[:1]


def test_a_call_that_shares_no_sampled_token_starts_a_fresh_branch() -> None:
    conv, _ = conversation()
    for prompt in ("Q:other", "P:zz|"):  # a side request; the first turn rewritten from its first character
        route = conv.route(prompt, Chars())
        assert route.new and route.branch is not None and route.branch.tokens == [] and route.branch.reprefill


def test_a_second_call_on_a_turn_in_flight_forks_after_the_last_turn() -> None:
    conv, main = conversation()
    main.lock._locked = True  # type: ignore[attr-defined]  # a turn of main is being generated
    route = conv.route("P:ab|U:cd|V:", Chars())
    assert route.new and route.branch.tokens == main.tokens and route.branch.inherited == 7
    assert route.branch.rendered == main.rendered and route.branch.bridge == "|"


def test_the_longest_shared_prefix_wins_over_branches() -> None:
    conv, main = conversation()
    fork = conv.route("P:ab|U:xy|", Chars()).branch
    conv.branches.append(fork)
    fork.append(ids("xy"), "xy", [-0.1, -0.1], None)
    fork.turns.append(Turn(ids("P:ab|U:xy"), ids("xy"), [-0.1, -0.1], "stop"))
    fork.rendered, fork.bridge = "P:ab|U:xy|", "|"
    fork.mark()
    assert conv.route("P:ab|U:xy|Z:", Chars()).branch is fork
    assert conv.route("P:ab|U:cd|Z:", Chars()).branch is main


def test_strict_sessions_refuse_a_changed_history() -> None:
    conv, main = conversation(strict=True)
    assert conv.route("P:ab|U:cd|V:", Chars()).branch is main
    with pytest.raises(EndpointError, match="history was changed"):
        conv.route("P:ab|U:xy|", Chars())


def test_samples_give_the_final_branch_to_the_sample_and_mask_inherited_tokens() -> None:
    from slime_like.core.sample import Sample

    conv, main = conversation()
    fork = conv.route("P:ab|U:cX|W:", Chars()).branch
    conv.branches.append(fork)
    fork.append(ids("X|W:"), "X|W:", None, None)
    fork.append(ids("e"), "e", [-3.0], None)
    fork.turns.append(Turn(fork.tokens[:-1], ids("e"), [-3.0], "stop"))
    conv.last = fork
    sample = Sample(index=7, prompt="p")
    pairs = conv.samples(sample)
    assert [b for b, _ in pairs] == [fork, main] and pairs[0][1] is sample
    assert sample.tokens == ids("P:ab|U:cX|W:e")
    # "ab" and "c" were sampled in main and train there: here only "e" does.
    assert sample.loss_mask == [0] * 10 + [1] and sample.rollout_log_probs[-1] == -3.0
    other = pairs[1][1]
    assert other is not sample and other.tokens == ids("P:ab|U:cd") and other.loss_mask == [1, 1, 0, 0, 0, 1, 1]
    assert (sample.metadata["openai_branch"], other.metadata["openai_branch"]) == (0, 1)


def test_text_parts_are_joined_images_kept_and_other_parts_refused() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert plain_messages([{"role": "user", "content": parts}, {"role": "assistant"}]) == [
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": ""},
    ]
    image = [{"type": "image_url", "image_url": {"url": "data:x"}}, {"type": "text", "text": "a"}]
    assert plain_messages([{"role": "user", "content": image}]) == [
        {"role": "user", "content": [{"type": "image", "image": "data:x"}, {"type": "text", "text": "a"}]}
    ]
    with pytest.raises(EndpointError, match="file"):
        plain_messages([{"role": "user", "content": [{"type": "file", "file": {"file_id": "x"}}]}])


def test_an_agent_run_s_extra_branches_take_its_reward_and_go_when_its_group_restarts() -> None:
    from types import SimpleNamespace

    from rollout.group import run_branches
    from rollout.sampling import return_to_buffer
    from slime_like.core.sample import Sample

    conv, main = conversation()
    fork = conv.route("P:ab|U:cX|W:", Chars()).branch
    conv.branches.append(fork)
    fork.append(ids("X|W:"), "X|W:", None, None)
    fork.append(ids("e"), "e", [-3.0], None)
    conv.last = fork
    first, run = Sample(index=6, prompt="p"), Sample(index=7, prompt="p")
    group = [first, *[s for _, s in conv.samples(run)]]
    assert [s.metadata.get("openai_branch") for s in group] == [None, 0, 1]
    assert run_branches(group) == {2: 1}  # the extra branch is scored as the run (position 1)

    returned: list = []
    buffer = SimpleNamespace(add_groups=returned.extend)
    ctx = SimpleNamespace(args=SimpleNamespace(partial_rollout=False), count=lambda *a: None)
    origin = {id(first): {}, id(run): {}}  # what the buffer served: the extra branch was not
    return_to_buffer(ctx, buffer, [group], origin)  # type: ignore[arg-type]
    assert returned == [[first, run]] and run.tokens == [] and run.response_length == 0


def test_tool_call_arguments_are_rendered_as_a_mapping() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "add", "arguments": '{"a": 3}'}}
    odd = {"id": "d", "type": "function", "function": {"name": "add", "arguments": "not json"}}
    (message,) = plain_messages([{"role": "assistant", "content": None, "tool_calls": [call, odd]}])
    assert message["tool_calls"][0]["function"]["arguments"] == {"a": 3}
    assert message["tool_calls"][1] == odd and call["function"]["arguments"] == '{"a": 3}'  # the caller's is kept
