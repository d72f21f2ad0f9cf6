"""slime's `BaseAdapter`: an agent's HTTP server whose sessions are sessions of our OpenAI-compatible endpoint.

As in slime, a generate function opens a session per sample (`open_session(sid)`), the agent calls the adapter's
app with the sid as its API key (`Authorization: Bearer <sid>`, or `metadata.session_id` / `user` in the body), and
`finish_session(sid, base_sample=..., reward=...)` turns the session into samples. Each call is one turn of
rollout/openai_endpoint.py, on the rollout's event loop (the app may run in its own thread, `run_app_in_thread`):
rendered once, generated through the router, recorded token in, token out.

Forks: a session is a conversation of branches (rollout/openai_session.py). A call whose messages continue a
branch's last turn extends it; one that continues an earlier turn, or changes the history (the agent went back and
tried again, re-serialised or trimmed its turns) forks a new
branch from that turn; one that continues nothing starts a fresh branch. `finish_session` gives one sample per
branch that has model tokens of its own; a turn shared by several branches trains once, in the first (the others
keep it as context, loss mask 0), as in slime's trajectory manager.

Differences from slime: a sid must have been opened (slime serves unknown sids as new sessions): the sid is the
only credential, so make it unguessable; `max_new_tokens` of `sampling_defaults` bounds each branch's whole response
(as `--rollout-max-response-len` does); `max_context_tokens` bounds prompt plus response; `fork_threshold_tokens`
and `reasoning_parser` are accepted and unused (branches keep the sampled ids, so there is no drift to absorb);
`tool_parser` is the rollout's `--sglang-tool-call-parser`.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web
from slime.utils.types import Sample, Status

from rollout.anthropic_messages import flatten_content  # noqa: F401  # slime's name for it, here
from rollout.context import current_context
from rollout.openai_endpoint import OpenAIEndpoint, _error
from rollout.openai_session import Conversation, EndpointError

_STATE_KEY = "slime_agent_endpoint"  # the rollout's (unserved) endpoint whose sessions the adapters use


@dataclasses.dataclass
class Session:
    """One sid: its sample, sampling defaults and branches, and the rollout loop its turns run on."""

    endpoint: OpenAIEndpoint
    loop: asyncio.AbstractEventLoop
    conversation: Conversation  # the branches its calls made (rollout/openai_session.py)
    max_context_tokens: int = 0
    inflight: set[asyncio.Task[Any]] = dataclasses.field(default_factory=set)  # turns running on `loop`


def tool_call_dict(name: str, arguments: dict[str, Any] | None) -> dict[str, Any]:
    """An OpenAI-shape tool call with its arguments as a mapping."""
    return {"type": "function", "function": {"name": name, "arguments": arguments or {}}}


def manager_finish_reason(tool_uses: list[dict[str, Any]], raw_finish: str) -> str:
    """`tool_calls` when the turn called a tool, else SGLang's finish reason."""
    return "tool_calls" if tool_uses else (raw_finish or "stop")


def sid_from_bearer(request: web.Request) -> str | None:
    """The sid in `Authorization: Bearer <sid>`, or None."""
    auth = request.headers.get("Authorization", "")
    return (auth[7:].strip() or None) if auth.lower().startswith("bearer ") else None


def sid_from_body(body: dict[str, Any] | None) -> str | None:
    """The sid in an OpenAI-shape body (`metadata.session_id`, then `user`), or None."""
    if not body:
        return None
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and metadata.get("session_id"):
        return str(metadata["session_id"])
    return str(body["user"]) if body.get("user") else None


class BaseAdapter:
    """An agent-facing HTTP app over the rollout's endpoint: sessions by sid, one sample per branch."""

    logger: logging.Logger = logging.getLogger(__name__)
    log_prefix: str = "adapter"

    def __init__(
        self,
        *,
        tokenizer: Any,
        sglang_url: str | None = None,
        tool_parser: str | None = None,
        reasoning_parser: str | None = None,
        max_turns_per_sid: int | None = None,
        fork_threshold_tokens: int | None = None,
        debug_callback: Callable[..., None] | None = None,
    ) -> None:
        self.tokenizer = tokenizer  # the rollout's tokenizer renders and decodes; this one is kept for callers
        self.sglang_url = sglang_url  # generation goes through the rollout's router (rollout.generate)
        self.tool_parser, self.reasoning_parser = tool_parser, reasoning_parser
        self.max_turns_per_sid = max_turns_per_sid
        self.debug_callback = debug_callback
        self.store: dict[str, Session] = {}
        self.closed: set[str] = set()
        self._turns: dict[str, int] = {}
        self.app = web.Application(client_max_size=64 * 2**20)
        self.app.router.add_get("/healthz", _health)
        self.app.router.add_get("/v1/models", _health)
        self._register_routes(self.app)

    def _register_routes(self, app: web.Application) -> None:
        """Add the protocol's POST route(s)."""
        raise NotImplementedError

    # --- session lifecycle (called from the generate function, on the rollout's loop) -----------------------

    def open_session(
        self, sid: str, *, sampling_defaults: dict[str, Any] | None = None, max_context_tokens: int = 0
    ) -> None:
        """Register a fresh sid for the sample being generated; sids must be unique."""
        ctx = current_context()
        if ctx is None:
            raise RuntimeError(
                f"{type(self).__name__}.open_session({sid!r}) must run inside a rollout's generate function "
                "(--custom-generate-function-path): its turns are generated by that rollout's engines"
            )
        if sid in self.store or sid in self.closed:
            raise ValueError(f"session_id {sid!r} already exists; sids must be unique per agent run")
        endpoint = ctx.plugin_state.get(_STATE_KEY)
        if endpoint is None:
            endpoint = ctx.plugin_state[_STATE_KEY] = OpenAIEndpoint(ctx)  # sessions only: the adapter serves
        params = dict(sampling_defaults or {})
        params.setdefault("max_new_tokens", 4096)
        if max_context_tokens:
            params["max_new_tokens"] = min(int(params["max_new_tokens"]), max_context_tokens)
        conversation = endpoint.open_session(Sample(index=None), params)
        conversation.strict = False  # slime forks every history it is sent
        self.store[sid] = Session(endpoint, asyncio.get_running_loop(), conversation, max_context_tokens)

    async def shutdown_session(self, sid: str, *, wait_timeout: float = 5.0) -> None:
        """Refuse the sid's further calls and wait (then cancel) the turns it has in flight."""
        self.closed.add(sid)
        session = self.store.get(sid)
        if session is None or not session.inflight:
            return
        _, late = await asyncio.wait(list(session.inflight), timeout=wait_timeout)
        for task in late:
            task.cancel()

    async def finish_session(
        self,
        sid: str,
        *,
        base_sample: Sample,
        reward: float = 0.0,
        extra_metadata: dict[str, Any] | None = None,
        wait_timeout: float = 5.0,
    ) -> list[Sample]:
        """The sid's branches as samples (one per branch with model tokens of its own), each with `reward`;
        a second call returns []."""
        await self.shutdown_session(sid, wait_timeout=wait_timeout)
        session = self.store.pop(sid, None)
        if session is None:
            return []
        await session.endpoint.close_session(session.conversation.id)
        samples = []
        for branch, sample in session.conversation.samples(copy.deepcopy(base_sample)):
            if not any(branch.loss_mask[branch.inherited :]):
                continue  # no turn of its own: every model token trains in the branch it forked from
            limit = session.max_context_tokens
            if limit and len(sample.tokens) > limit:
                cut = limit - sample.prompt_length
                sample.tokens, sample.loss_mask = sample.tokens[:limit], sample.loss_mask[:cut]
                sample.rollout_log_probs, sample.response_length = sample.rollout_log_probs[:cut], cut
            # As slime: a last turn cut by its max_tokens is flagged in metadata; the status says TRUNCATED only when
            # the branch spent its whole response budget.
            truncated = branch.truncated or (bool(branch.turns) and branch.turns[-1].finish_reason == "length")
            spent = Status.TRUNCATED if branch.truncated else Status.COMPLETED
            sample.status = Status.ABORTED if branch.aborted else spent
            sample.rollout_id = base_sample.rollout_id if base_sample.rollout_id is not None else base_sample.index
            sample.session_id, sample.reward = sid, reward
            use_tool = any(t.tool_calls for t in branch.turns)
            sample.metadata = {**sample.metadata, **(extra_metadata or {}), "truncated": truncated}
            sample.metadata.update(use_tool=use_tool, ill_formed=False)
            samples.append(sample)
        return samples

    async def drop_session(self, sid: str, *, wait_timeout: float = 5.0) -> None:
        """Forget the sid and its turns."""
        await self.shutdown_session(sid, wait_timeout=wait_timeout)
        session = self.store.pop(sid, None)
        if session is not None:
            await session.endpoint.close_session(session.conversation.id)

    # --- one turn -------------------------------------------------------------------------------------------

    def _sid_of(self, request: web.Request, body: dict[str, Any]) -> str:
        """The request's sid, checked: opened, not closed, under the turn cap."""
        sid = sid_from_bearer(request) or sid_from_body(body)
        if sid in self.closed:
            raise EndpointError(503, f"session {sid!r} is closed (its sample finished)", "server_error")
        if sid is None or sid not in self.store:
            raise EndpointError(401, "unknown session: send an opened sid as the API key", "authentication_error")
        count = self._turns.get(sid, 0)
        if self.max_turns_per_sid is not None and count >= self.max_turns_per_sid:
            raise EndpointError(429, f"sid {sid!r} exceeded max_turns_per_sid={self.max_turns_per_sid}", "rate_limit_error")  # fmt: skip
        self._turns[sid] = count + 1
        return sid

    async def _chat(self, sid: str, body: dict[str, Any], handler: Any = None) -> dict[str, Any]:
        """One turn of the sid (OpenAI chat, or the endpoint dialect `handler`'s), on the rollout's loop (wherever
        this app runs): the answer."""
        session = self.store[sid]
        turn = self._turn(session, body, handler)
        if asyncio.get_running_loop() is session.loop:
            return await turn
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(turn, session.loop))

    async def _turn(self, session: Session, body: dict[str, Any], handler: Any = None) -> dict[str, Any]:
        """Pick (or fork, or start) the branch the messages continue and generate its next turn."""
        task = asyncio.current_task()
        assert task is not None
        session.inflight.add(task)
        try:
            return await self._turn_on_loop(session, body, handler)
        finally:
            session.inflight.discard(task)

    async def _turn_on_loop(self, session: Session, body: dict[str, Any], handler: Any = None) -> dict[str, Any]:
        conversation = session.conversation
        answer = await session.endpoint.complete(conversation, body, handler)
        if self.debug_callback is not None:
            branch = conversation.last
            assert branch is not None  # the call just ran on it
            try:
                self.debug_callback(branch.id, body.get("messages"), body.get("tools"), answer, branch.turns[-1])
            except Exception:
                self.logger.exception("debug_callback failed (branch %s)", branch.id)
        return answer

    async def _handle(self, request: web.Request, respond: Callable[..., Coroutine[Any, Any, web.StreamResponse]], handler: Any = None) -> web.StreamResponse:  # fmt: skip
        """Parse, translate (`self._to_openai`; a `handler` of an endpoint dialect takes the body as it is), run the
        turn, answer with `respond(request, body, answer)`."""
        try:
            try:
                body = await request.json()
            except ValueError as exc:
                raise EndpointError(400, f"the body is not JSON: {exc}") from exc
            sid = self._sid_of(request, body)
            answer = await self._chat(sid, body if handler is not None else self._to_openai(body), handler)
        except EndpointError as exc:
            return _error(exc)
        return await respond(request, body, answer)

    def _to_openai(self, body: dict[str, Any]) -> dict[str, Any]:
        """The request as an OpenAI chat body."""
        return body


async def _health(request: web.Request) -> web.Response:
    """Readiness probe."""
    return web.json_response({"ok": True})
