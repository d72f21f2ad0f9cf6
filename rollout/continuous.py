"""--fully-async: groups generate continuously on the engines; each training step takes the next finished batch.

A `ContinuousRollout` lives on the rollout manager's event loop for the whole run. It keeps groups generating
(drawn from the buffer, run by the same group runner, reward and dynamic filter as the other loops) and queues the
finished groups the filter keeps. `take(version)` hands the trainer the next `--rollout-batch-size` of them,
waiting only while fewer are ready; a group over --max-weight-staleness at that version never trains: it is
generated again from its prompt, or dropped (--stale-group-policy), and counted.

How many groups generate at once is bounded by --max-inflight-groups (default one batch, as AReaL's
max_concurrent_rollouts; never more than the servers take requests for): every request in flight shares the
engines' decode steps, so fewer of them let a long response end within the staleness bound. How many it holds
(generating + ready) is bounded too: one batch plus those in flight, and under --max-weight-staleness N no more
than could still train within N versions (a group started now trains after those ahead of it), so few are
generated only to be thrown away. The oldest ready groups train first.

Weight updates: `pause(mode)` stops starting work and pauses every server (SGLang's /pause_generation: `abort`
returns in-flight requests with their tokens, which continue after the update as a partial rollout; `retract` and
`in_place` keep them inside the engine); `resume(version)` continues with the new weights. Each step's groups are
accounted for (buffer/accounting.py, a ledger that carries the held groups into the next step).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from typing import Any

from buffer.buffer import Buffer
from rollout.abort import abort_all_servers, abort_and_drain
from rollout.context import RolloutContext, RolloutRecord
from rollout.filters import apply_dynamic_filter
from rollout.group import run_group
from rollout.pause import continue_all, pause_all
from rollout.postprocess import finish_rollout
from rollout.sampling import MAX_DROPPED_PER_KEPT, return_to_buffer
from rollout.staleness import LAUNCH_VERSION, mask_older_spans, oldest_version, stale_group, staleness_metrics
from slime_like.core.sample import Sample, Status

logger = logging.getLogger(__name__)

# Seconds to wait, after an abort-mode pause, for the aborted requests' answers (they come at once; a request that
# reached a server just after the pause waits there and runs after the update instead).
ABORT_ANSWER_WAIT = 5.0

FINISHED, ABORTED, STALE = "finished", "aborted", "stale"


def _tokens(group: list[Sample]) -> int:
    return sum(s.response_length for s in group)


def _oldest(group: list[Sample], version: int) -> int:
    """The oldest weight version of the group's tokens (`version` when none is known)."""
    return min((v for v in map(oldest_version, group) if v is not None), default=version)


class ContinuousRollout:
    """Keeps groups generating between training steps; `take` hands out the next batch (all on one event loop)."""

    def __init__(self, ctx: RolloutContext, buffer: Buffer, params: dict[str, Any], version: int) -> None:
        args = ctx.args
        self.ctx, self.buffer, self.params, self.args = ctx, buffer, params, args
        self.batch, self.bound = args.rollout_batch_size, args.max_weight_staleness
        servers = max(1, len(ctx.server_urls))
        served = max(1, args.sglang_server_concurrency * servers // args.n_samples_per_prompt)
        self.inflight = min(getattr(args, "max_inflight_groups", None) or self.batch, served)
        self.version = version  # the servers' weight version
        self.next_train = version  # the version the next batch trains at
        self.running: dict[asyncio.Task[str], list[Sample]] = {}
        self.ready: list[list[Sample]] = []  # finished, kept by the dynamic filter, not trained yet
        self.origin: dict[int, dict[str, Any]] = {}  # id(sample) -> metadata as drawn, to regenerate from the prompt
        self.gate = asyncio.Event()  # cleared while paused: no group starts or continues
        self.gate.set()
        self.changed = asyncio.Event()  # set whenever a group settles (take waits on it)
        self.closed = asyncio.Event()
        self.error: BaseException | None = None
        self.stopping = False
        self.pauses = 0  # weight updates so far: a group aborted by one continues, any other abort returns it
        self.dropped = 0  # groups the dynamic filter dropped since the last batch
        # Tasks started from callbacks run in this context, so plugins find the rollout context (rollout.context).
        self.vars = contextvars.copy_context()
        self.ledger = buffer.open_ledger(carries=True)
        ctx.accounting = self.ledger
        ctx.record = RolloutRecord(buffer)  # the groups the dynamic filter dropped since the last batch
        # Per-step clocks: the step begins when the previous batch was taken.
        self.step_start = time.monotonic()
        self.generated = 0  # response tokens the servers produced this step
        self.idle_s, self.idle_since = 0.0, self.step_start

    # -- generation ------------------------------------------------------------------------------------------

    def capacity(self) -> int:
        """How many groups may be held (generating + ready)."""
        cap = self.batch + self.inflight
        if self.bound is not None:
            # Versions the next batch trains behind the servers' (1 while a step trains, before its update).
            lag = self.next_train - self.version
            cap = min(cap, (self.bound + 1 - lag) * self.batch)
        return cap

    def fill(self) -> None:
        """Start groups from the buffer up to the capacity (not while paused or stopping)."""
        if self.stopping or self.error is not None or not self.gate.is_set():
            return
        room = min(self.capacity() - len(self.running) - len(self.ready), self.inflight - len(self.running))
        if room > 0:
            for group in self.buffer.get_groups(room):
                self._start(group)
        self._clock()

    def _start(self, group: list[Sample]) -> None:
        for sample in group:
            self.origin.setdefault(id(sample), dict(sample.metadata))
            if not sample.response_length:  # the oldest version any of its tokens can have
                sample.metadata[LAUNCH_VERSION] = self.version
        self.ctx.count("groups_started")
        task = asyncio.create_task(self._generate(group), context=self.vars)
        self.running[task] = group
        task.add_done_callback(self._settle, context=self.vars)

    async def _generate(self, group: list[Sample]) -> str:
        """Generate and score the group; continue it after each pause that aborted it."""
        while True:
            await self.gate.wait()
            if self.stopping:
                return ABORTED
            if stale_group(group, self.version, self.bound):  # aborted earlier and too old by now
                return STALE
            pauses, before = self.pauses, _tokens(group)
            try:
                finished = await run_group(self.ctx, group, self.params)
            finally:
                self.generated += _tokens(group) - before
            if finished:
                return FINISHED
            if self.pauses == pauses or self.stopping:  # aborted, but not by a weight update
                return ABORTED
            self.ctx.count("samples_partial", sum(s.status == Status.ABORTED for s in group))

    def _settle(self, task: asyncio.Task[str]) -> None:
        """A group task ended: queue, drop, regenerate or hand back its group; then start more."""
        group = self.running.pop(task)
        try:
            if self.stopping or task.cancelled():
                return
            error = task.exception()
            if error is not None:
                self.buffer.add_groups([group])  # its prompt is not lost: the error stops the run
                raise error
            outcome = task.result()
            if outcome == STALE:
                self._stale(group)
            elif outcome == ABORTED:
                self.ctx.count("groups_aborted")
                return_to_buffer(self.ctx, self.buffer, [group], self._origins(group))
            else:
                self._finished(group)
            self.fill()
        except BaseException as error:  # the run stops at the next `take`, with this error
            if self.error is None:
                self.error = error
        finally:
            self._clock()
            self.changed.set()

    def _finished(self, group: list[Sample]) -> None:
        self.ctx.count("groups_generated")
        if stale_group(group, self.version, self.bound):  # it could only train at this version or later
            self._stale(group)
            return
        verdict = apply_dynamic_filter(self.ctx.hooks.dynamic_filter, self.args, group)
        if verdict.keep or (verdict.keep_when_insufficient and len(self.ready) + len(self.running) < self.batch):
            self.ready.append(group)
            return
        self.dropped += 1
        self.ctx.record.generated.append(group)
        self.ledger.drop(group, verdict.reason or "filtered")
        self._forget(group)

    def _stale(self, group: list[Sample]) -> None:
        """Over --max-weight-staleness: back to the buffer as its prompt, or dropped."""
        if self.args.stale_group_policy == "drop":
            self.ledger.drop(group, "stale")
            self._forget(group)
            return
        origins = self._origins(group)
        group[:] = [s for s in group if id(s) in origins]  # an agent's extra branches go with the old tokens
        for sample in group:
            sample.reset(origins[id(sample)])
        self.ctx.count("groups_stale_regenerated")
        self.buffer.add_groups([group])

    def _origins(self, group: list[Sample]) -> dict[int, dict[str, Any]]:
        return {id(s): self.origin[id(s)] for s in group if id(s) in self.origin}

    def _forget(self, group: list[Sample]) -> None:
        for sample in group:
            self.origin.pop(id(sample), None)

    def _clock(self) -> None:
        """Engine idle time: nothing generating (or paused)."""
        idle = not self.running or not self.gate.is_set()
        now = time.monotonic()
        if idle and self.idle_since is None:
            self.idle_since = now
        elif not idle and self.idle_since is not None:
            self.idle_s += now - self.idle_since
            self.idle_since = None

    # -- what the manager calls ------------------------------------------------------------------------------

    async def serve(self) -> None:
        """Generate until `stop` (an error stops generating and is raised by the next `take`)."""
        try:
            self.fill()
        except Exception as error:  # e.g. the data source or buffer filter failed
            self.error = error
        await self.closed.wait()

    async def take(self, version: int) -> tuple[list[list[Sample]], dict[str, Any]]:
        """The next --rollout-batch-size groups to train at weight `version`, none over the staleness bound; with
        the step's counters and metrics."""
        start = time.monotonic()
        while True:
            if self.error is not None:
                raise self.error
            for group in [g for g in self.ready if stale_group(g, version, self.bound)]:
                self.ready.remove(group)
                self._stale(group)
            if len(self.ready) >= self.batch:
                break
            if self.dropped > MAX_DROPPED_PER_KEPT * self.batch:
                raise RuntimeError(
                    f"dynamic sampling dropped {self.dropped} groups and {len(self.ready)} of {self.batch} are ready: "
                    "check --dynamic-sampling-filter-path"
                )
            self.changed.clear()
            self.fill()
            if not self.running:
                raise RuntimeError(
                    f"--fully-async: {len(self.ready)} of {self.batch} groups ready and nothing generating: the data "
                    "source returned no more prompts"
                )
            await self.changed.wait()
        waited = time.monotonic() - start
        self.ready.sort(key=lambda g: (_oldest(g, version), g[0].group_index is None, g[0].group_index or 0))
        batch, self.ready = self.ready[: self.batch], self.ready[self.batch :]
        self.next_train = version + 1
        if self.args.mask_offpolicy_in_partial_rollout:
            self.ctx.count("samples_offpolicy_masked", sum(mask_older_spans(s) for g in batch for s in g))
        self.ctx.record.generated.extend(batch)
        finish_rollout(self.ctx, batch)
        self.ctx.record = RolloutRecord(self.buffer)
        for group in batch:
            self._forget(group)
        return batch, self._close_step(batch, version, waited)

    def _close_step(self, batch: list[list[Sample]], version: int, waited: float) -> dict[str, Any]:
        """Check and restart the step's ledger; the step's counters and clocks."""
        held = [*self.running.values(), *self.ready]
        self.ledger.keep(batch)
        self.ledger.carry(held)
        counts = self.ledger.check()
        self.buffer.close_ledger()
        self.ledger = self.ctx.accounting = self.buffer.open_ledger(carries=True)
        self.ledger.draw(held, "carried")
        counters = {**self.ctx.counters, **counts, "groups_kept": len(batch)}
        self.ctx.counters.clear()
        self.dropped = 0
        now = time.monotonic()
        self._clock()
        idle = self.idle_s + (now - self.idle_since if self.idle_since is not None else 0.0)
        seconds = max(now - self.step_start, 1e-9)
        metrics = {f"rollout/{k}": v for k, v in counters.items()}
        metrics.update(staleness_metrics(batch, version))
        metrics.update(
            {
                "rollout/time": seconds,
                "rollout/groups_generating": len(self.running),
                "rollout/groups_ready": len(self.ready),
                "rollout/weight_version": self.version,
                "time/trainer_idle": waited,
                "time/engine_idle": idle,
                "time/engine_idle_frac": idle / seconds,
                "perf/tokens_generated_per_s": self.generated / seconds,
            }
        )
        self.step_start, self.generated, self.idle_s = now, 0, 0.0
        self.idle_since = now if self.idle_since is not None else None
        return metrics

    async def pause(self, mode: str, urls: list[str]) -> None:
        """Before a weight update: start nothing, pause every server in `mode` (abort: in-flight requests return
        their tokens so far and continue after the update)."""
        self.gate.clear()
        self.pauses += 1
        self._clock()
        if mode == "abort":
            self.ctx.aborting = True  # nothing new is sent, and the answers are aborts we asked for
            # Abort first and wait for the answers: SGLang's abort-mode pause looks again only once a second while
            # any request is in flight (~1 s per update, scripts/bench/README.md).
            await abort_all_servers(self.ctx)
            await self._answered()
        await asyncio.to_thread(pause_all, urls, mode)
        if mode == "abort":
            await self._answered()

    async def _answered(self) -> None:
        """Wait (bounded) until every request sent has answered."""
        deadline = time.monotonic() + ABORT_ANSWER_WAIT
        while self.ctx.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def resume(self, version: int, urls: list[str]) -> None:
        """After a weight update: continue every server on weight `version`; paused groups go on."""
        try:
            await asyncio.to_thread(continue_all, urls)
        finally:
            self.version = version
            self.ctx.server_urls = list(urls)
            self.ctx.aborting = False
            self.gate.set()
            self.fill()

    def state_dict(self) -> dict[str, Any]:
        """The buffer's state with every held group in front of its returned ones: ready groups as they are,
        generating ones as far as their answered requests go (they continue from there after --load)."""
        state = self.buffer.state_dict()
        held = [*self.ready, *self.running.values()]
        state["returned"] = [[s.to_dict() for s in g] for g in held] + state["returned"]
        state["fully_async"] = {"groups_ready": len(self.ready), "groups_generating": len(self.running)}
        return state

    async def stop(self, timeout: float = 60.0) -> None:
        """Abort what still runs on the servers (bounded) and stop; held groups are dropped with the run."""
        self.stopping = True
        self.gate.set()
        tasks = list(self.running)
        if tasks:
            try:
                await asyncio.wait_for(abort_and_drain(self.ctx, tasks), timeout)
            except TimeoutError:
                logger.warning("--fully-async: %d groups still generating after %.0fs of aborts", len(tasks), timeout)
                for task in tasks:
                    task.cancel()
        self.buffer.close_ledger()
        self.closed.set()
