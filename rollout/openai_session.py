"""A sample's agent session on the OpenAI-compatible endpoint: its branches of token-exact turns.

A `ChatSession` (one branch) keeps the ids SGLang received and produced, never re-tokenised:
- turn 1 sends the rendered prompt's ids;
- after a turn, the reply is rendered back into the conversation as the template would show it (text A). The
  template's text for the assistant turn is A minus the prompt text; the model's decoded output is a prefix of it
  (e.g. `hi<|im_end|>` of `hi<|im_end|>\\n`): the rest (the "bridge", here `\\n`) closes the turn. When the template
  shows the turn differently from what was sampled (it drops reasoning, or re-serialises tool calls), the sampled
  ids are kept anyway and the turn is closed with the template's end-of-turn text (counted as
  `rollout/openai_template_drift`): training sees what the model wrote, not what the template would print;
- turn k+1 renders the whole conversation again; when it starts with A, only the new text after A (new user/tool
  turns and the generation prompt), behind the bridge, is tokenised and appended with loss mask 0.
Model tokens get loss mask 1 and SGLang's log-probs; everything else loss mask 0 and log-prob 0.0.

A `Conversation` (what one sample's base URL names) is a list of branches. Real agents change their history
(tool calls re-serialised as text, old turns trimmed or summarised, side requests, retries): a call that does not
extend a branch starts a new branch from the longest prefix it shares with what the conversation holds (`route`):
the latest turn it repeats as the template shows it, then as many of the following tokens as render as the new text
does; the rest is tokenised anew. Each branch becomes a sample; a token shared by several branches trains only in
the first (the others keep it as context, loss mask 0), as slime's trajectory manager does.
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field
from typing import Any

from buffer.multimodal import merge_train_inputs
from slime_like.core.sample import Sample

_SENTINEL = "\u2063SLIME_LIKE_TURN\u2063"
BRANCH_KEY = "openai_branch"  # sample.metadata: 0 for an agent run's own sample, k for its k-th other branch  # an assistant content no real turn contains, to find the turn's end


class EndpointError(Exception):
    """A request the endpoint answers with an error (HTTP status, message, and the error's type)."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def render(tokenizer: Any, messages: list[dict[str, Any]], generation_prompt: bool, tools: Any = None) -> str:
    """The chat template's text for `messages` (with the assistant's generation prompt or not, and the tools)."""
    extra = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt, **extra)


def turn_end_text(tokenizer: Any) -> str:
    """What the chat template writes after an assistant message's content (e.g. `<|im_end|>\\n`)."""
    probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}]
    text = render(tokenizer, probe, generation_prompt=False)
    return text[text.index(_SENTINEL) + len(_SENTINEL) :]


def bridge_text(prompt_text: str, with_reply: str, output_text: str, turn_end: str) -> tuple[str, bool]:
    """The template text that closes a sampled turn, and whether the template shows that turn differently.

    `with_reply` is the conversation rendered with the reply appended, `prompt_text` without it, `output_text` the
    decoded sampled ids. The sampled ids always stay; on drift the turn is closed with the end-of-turn text, less
    what the output already ends with (an EOS token it sampled)."""
    if with_reply.startswith(prompt_text):
        shown = with_reply[len(prompt_text) :]
        if shown.startswith(output_text):
            return shown[len(output_text) :], False
    overlap = max((k for k in range(len(turn_end) + 1) if output_text.endswith(turn_end[:k])), default=0)
    return turn_end[overlap:], True


@dataclass
class Turn:
    """One /generate call of a session: the ids sent, the ids and log-probs sampled, the finish reason."""

    input_ids: list[int]
    output_ids: list[int]
    output_log_probs: list[float]
    finish_reason: str
    meta_info: dict[str, Any] = field(repr=False, default_factory=dict)
    tool_calls: int = 0  # calls parsed from its output


@dataclass
class Generated:
    """One call's turn before its branch keeps it: the ids sent (the new ones and their text) and what was sampled."""

    input_ids: list[int]
    new_ids: list[int]
    new_text: str
    prompt_text: str
    ids: list[int]
    log_probs: list[float]
    text: str  # the sampled ids decoded
    reason: dict[str, Any]  # SGLang's finish reason, its "type" always set
    meta: dict[str, Any] = field(repr=False, default_factory=dict)
    images: list[Any] = field(repr=False, default_factory=list)  # images the new ids hold (openai_images.py)
    image_keys: list[str] = field(default_factory=list)
    train_inputs: dict[str, Any] | None = field(repr=False, default=None)  # the processor's tensors of `images`


@dataclass(frozen=True)
class Mark:
    """A session's state after one turn: its token and text counts, and the conversation's text then."""

    tokens: int
    texts: int
    turns: int
    rendered: str
    bridge: str


@dataclass
class ChatSession:
    """One branch of a conversation: every token so far with its loss mask and log-prob, and the text it renders as."""

    id: str
    sample_index: int | None
    sampling_params: dict[str, Any]
    budget: int  # response tokens (model and inserted) the whole sample may have
    tokens: list[int] = field(default_factory=list)
    prompt_length: int = 0
    prompt_text: str = ""  # the text of the first prompt's ids
    loss_mask: list[int] = field(default_factory=list)  # one per token after the prompt
    log_probs: list[float] = field(default_factory=list)  # one per token after the prompt
    texts: list[str] = field(default_factory=list)  # the response's text, piece by piece
    spans: list[tuple[int, dict[str, Any] | None]] = field(default_factory=list)  # (n tokens, answer meta) in order
    turns: list[Turn] = field(default_factory=list)
    rendered: str = ""  # the conversation so far as the template shows it, with the last reply
    bridge: str = ""  # template text that closes the last sampled turn, sent with the next turn
    truncated: bool = False  # the budget is spent
    aborted: bool = False  # the rollout aborted a request of this session
    closed: bool = False
    drift: int = 0  # turns the template shows differently from the sampled ids
    inflight: str | None = None  # rid of the request being generated
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    marks: list[Mark] = field(default_factory=list, repr=False)  # the state after each turn, for branching
    inherited: int = 0  # leading response tokens copied from the branch this one forked from (trained there)
    reprefill: bool = False  # a fork or a later fresh branch: the next appended tokens are prefilled again
    images: list[Any] = field(default_factory=list, repr=False)  # every image its tokens hold, in order
    image_keys: list[str] = field(default_factory=list)  # their identities (openai_images.image_key)
    train_inputs: dict[str, Any] | None = field(default=None, repr=False)  # the processor's tensors of `images`

    @property
    def response_length(self) -> int:
        """Tokens after the first prompt."""
        return len(self.tokens) - self.prompt_length

    def append(self, ids: list[int], text: str, log_probs: list[float] | None, meta: dict[str, Any] | None) -> None:
        """Append tokens: the model's (log-probs given, loss mask 1) or inserted ones (loss mask 0, log-prob 0.0)."""
        self.tokens += ids
        self.loss_mask += [1 if log_probs is not None else 0] * len(ids)
        self.log_probs += log_probs if log_probs is not None else [0.0] * len(ids)
        self.texts.append(text)
        self.spans.append((len(ids), meta))

    def keep(self, turn: Generated) -> None:
        """Take a generated turn: its new prompt tokens (loss mask 0), then its sampled ids (loss mask 1)."""
        if self.tokens:
            self.append(turn.new_ids, turn.new_text, None, None)
        else:
            self.tokens, self.prompt_length, self.prompt_text = list(turn.new_ids), len(turn.new_ids), turn.prompt_text
        self.append(turn.ids, turn.text, turn.log_probs, turn.meta)
        if turn.images:
            self.images, self.image_keys = self.images + turn.images, self.image_keys + turn.image_keys
            self.train_inputs = merge_train_inputs([self.train_inputs, turn.train_inputs])
        self.turns.append(Turn(turn.input_ids, turn.ids, turn.log_probs, turn.reason["type"], turn.meta))
        if turn.reason["type"] == "length" and self.response_length >= self.budget:
            self.truncated = True

    def mark(self) -> None:
        """Remember the state after the turn just recorded, so that a branch can start from it."""
        self.marks.append(Mark(len(self.tokens), len(self.texts), len(self.turns), self.rendered, self.bridge))

    def branch(self, k: int, sid: str) -> ChatSession:
        """A new session with this one's first `k + 1` turns (the state after turn k), to continue differently."""
        m = self.marks[k]
        new = self._copy(sid, m.tokens, m.texts, None)
        new.rendered, new.bridge, new.marks = m.rendered, m.bridge, self.marks[: k + 1]
        return new

    def cut(self, sid: str, tokens: int, pieces: int, last_text: str | None, rendered: str) -> ChatSession:
        """A new session with this one's first `tokens` tokens: `pieces` whole response pieces, then (if
        `last_text` is not None) the start of the next one, whose kept ids render as `last_text`; `rendered` is
        the conversation text those tokens stand for, which the next call's prompt extends."""
        new = self._copy(sid, tokens, pieces, last_text)
        new.rendered, new.bridge = rendered, ""
        new.marks = [m for m in self.marks if m.tokens <= tokens]
        return new

    def _copy(self, sid: str, tokens: int, pieces: int, last_text: str | None) -> ChatSession:
        n = tokens - self.prompt_length
        new = ChatSession(sid, self.sample_index, self.sampling_params, self.budget, prompt_length=self.prompt_length)
        new.prompt_text = self.prompt_text
        new.tokens, new.loss_mask, new.log_probs = self.tokens[:tokens], self.loss_mask[:n], self.log_probs[:n]
        new.texts, new.spans = self.texts[:pieces], self.spans[:pieces]
        if last_text is not None:
            cut = n - sum(k for k, _ in new.spans)
            new.texts, new.spans = [*new.texts, last_text], [*new.spans, (cut, self.spans[pieces][1])]
        new.turns = [t for t in self.turns if len(t.input_ids) + len(t.output_ids) <= tokens]
        new.inherited, new.reprefill = n, True
        return new

    def write_sample(self, sample: Sample) -> None:
        """Make the sample's tokens, response, loss mask, log-probs and version spans exactly this session's."""
        sample.tokens = list(self.tokens)
        sample.response = "".join(self.texts)
        sample.response_length = self.response_length
        sample.loss_mask = list(self.loss_mask)
        sample.rollout_log_probs = list(self.log_probs)
        sample.version_spans = []
        for n, meta in self.spans:
            sample.add_version_spans(n, meta)
        if self.turns:
            version = self.turns[-1].meta_info.get("weight_version")
            sample.weight_version = int(version) if version is not None and str(version).isdigit() else None
        if self.images:
            sample.multimodal_inputs = {"images": list(self.images)}
            sample.multimodal_train_inputs = self.train_inputs
        sample.metadata["openai_turns"] = len(self.turns)
        if self.drift:
            sample.metadata["openai_template_drift"] = self.drift


@dataclass
class Route:
    """Where a call goes: an existing branch it extends, or a new one (forked, or fresh when it shares no turn)."""

    branch: ChatSession | None
    new: bool  # `branch` was made for this call (registered by the caller)
    shared: int  # chars of the prompt text the branch already holds


@dataclass
class Conversation:
    """One sample's session (the id its base URL names): the branches its calls made, one unless the history
    changed. `strict` refuses a call that extends no branch (HTTP 400) instead of branching."""

    id: str
    sample_index: int | None
    sampling_params: dict[str, Any]
    budget: int
    strict: bool = False
    branches: list[ChatSession] = field(default_factory=list)
    last: ChatSession | None = None  # the branch of the latest call: the agent's final state
    closed: bool = False
    # Responses API (rollout/openai_responses.py): each stored response's id -> (its previous_response_id, the
    # items it was given and answered), so that a call naming it continues them.
    responses: dict[str, tuple[str | None, list[dict[str, Any]]]] = field(default_factory=dict, repr=False)

    @property
    def turns(self) -> list[Turn]:
        """Every turn of every branch (a turn shared by forks once)."""
        seen: dict[int, Turn] = {}
        for branch in self.branches:
            seen.update((id(t), t) for t in branch.turns)
        return list(seen.values())

    @property
    def truncated(self) -> bool:
        """A branch spent its token budget (the agent may then have given up)."""
        return any(b.truncated for b in self.branches)

    @property
    def aborted(self) -> bool:
        """The rollout aborted a request of some branch."""
        return any(b.aborted for b in self.branches)

    def samples(self, sample: Sample) -> list[tuple[ChatSession, Sample]]:
        """Each branch with its sample: `sample` becomes the latest call's branch (the agent's final state), each
        other branch with model tokens of its own a copy of `sample` as it was; a token a branch inherited from the
        one it forked from is trained there (loss mask 0 here)."""
        base = copy.deepcopy(sample)
        others = [b for b in self.branches if b is not self.last and any(b.loss_mask[b.inherited :])]
        out = []
        for branch in [self.last, *others] if self.last is not None else others:
            target = sample if branch is self.last else copy.deepcopy(base)
            branch.write_sample(target)
            target.loss_mask = [0] * branch.inherited + target.loss_mask[branch.inherited :]
            if len(self.branches) > 1:
                target.metadata[BRANCH_KEY] = len(out)
            out.append((branch, target))
        return out

    def route(self, prompt_text: str, tokenizer: Any, image_keys: list[str] | None = None) -> Route:
        """The branch a call with this prompt text (and images) continues, forking or starting one when it
        continues none. A branch holding images is only extended, by a call whose images start with its own.

        Pure decision plus the new branch object; registering and counting is the caller's."""
        best: tuple[int, int, ChatSession, Any] | None = None  # (chars shared, extends, branch, how)
        keys = list(image_keys or [])
        for branch in self.branches:
            if branch.images and (branch.lock.locked() or keys[: len(branch.image_keys)] != branch.image_keys):
                continue
            if branch.images and not (branch.turns and prompt_text.startswith(branch.rendered)):
                continue
            if branch.turns and prompt_text.startswith(branch.rendered):
                how: Any = "extend" if not branch.lock.locked() else len(branch.marks) - 1
                candidate = (len(branch.rendered), int(how == "extend"), branch, how)
            else:
                point = fork_point(branch, prompt_text, tokenizer)
                if point is None:
                    continue
                candidate = (point[0], 0, branch, point)
            if best is None or candidate[:2] >= best[:2]:
                best = candidate
        if best is None or (self.strict and self.branches and best[3] != "extend"):
            if self.strict and self.branches:
                raise EndpointError(
                    400, "the messages do not extend this session's conversation (history was changed; the run "
                    "refuses that: --openai-strict-history)",
                )  # fmt: skip
            fresh = ChatSession(self._branch_id(), self.sample_index, self.sampling_params, self.budget)
            fresh.reprefill = bool(self.branches)
            return Route(fresh, True, 0)
        shared, _, branch, how = best
        if how == "extend":
            return Route(branch, False, shared)
        if isinstance(how, int):  # a second continuation of a turn: fork after it
            return Route(branch.branch(how, self._branch_id()), True, shared)
        _, tokens, pieces, last_text = how
        return Route(branch.cut(self._branch_id(), tokens, pieces, last_text, prompt_text[:shared]), True, shared)

    def _branch_id(self) -> str:
        return self.id if not self.branches else f"{self.id}~{len(self.branches)}"


def fork_point(branch: ChatSession, text: str, tokenizer: Any) -> tuple[int, int, int, str | None] | None:
    """Where `text` leaves the branch: (chars of `text` the kept tokens render as, tokens kept, whole response
    pieces kept, the text of the partly kept piece or None), or None when it keeps no model token.

    The walk starts at the latest turn whose template text `text` repeats (sampled ids kept even where the template
    shows them differently), then keeps pieces whose text `text` goes on with, then the longest run of the next
    piece's ids that renders as a prefix of the rest."""
    start = next((m for m in reversed(branch.marks) if text.startswith(m.rendered)), None)
    if start is None:
        pos, tokens, first = 0, 0, -1  # the prompt piece first
    else:
        pos, tokens, first = len(start.rendered) - len(start.bridge), start.tokens, start.texts
    pieces = [(branch.prompt_text, branch.prompt_length)] if start is None else []
    pieces += [(t, n) for t, (n, _) in zip(branch.texts[max(first, 0) :], branch.spans[max(first, 0) :], strict=True)]
    kept, last_text = max(first, 0), None
    for i, (piece, n) in enumerate(pieces):
        if text.startswith(piece, pos):
            pos, tokens = pos + len(piece), tokens + n
            kept += 0 if (start is None and i == 0) else 1
            continue
        ids = branch.tokens[tokens : tokens + n]
        j, piece_text = _longest_rendering_prefix(tokenizer, ids, text, pos)
        if j and not (start is None and i == 0):
            pos, tokens, last_text = pos + len(piece_text), tokens + j, piece_text
        break
    if tokens <= branch.prompt_length or not any(branch.loss_mask[: tokens - branch.prompt_length]):
        return None  # no model token to keep: a fresh branch re-tokenises the prompt just as well
    return pos, tokens, kept, last_text


def _longest_rendering_prefix(tokenizer: Any, ids: list[int], text: str, pos: int) -> tuple[int, str]:
    """The most leading `ids` (and their text) that decode to a prefix of `text[pos:]` (binary search: a longer
    run renders as a prefix only if a shorter one does, but for ids ending inside a multi-byte character)."""
    lo, hi, found = 0, len(ids), ""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        decoded = tokenizer.decode(ids[:mid], skip_special_tokens=False)
        if text.startswith(decoded, pos):
            lo, found = mid, decoded
        else:
            hi = mid - 1
    return lo, found
