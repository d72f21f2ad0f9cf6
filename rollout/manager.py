"""The rollout proper: the data buffer, generation, rewards, filters, eval and the hand-off to training, through the
engine fleet (rollout/fleet.py) it owns."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from buffer.arguments import multimodal_dataset_kwargs
from buffer.buffer import Buffer
from buffer.data_source import DataSource, PromptDataset
from buffer.group_rewards import RewardShaping
from buffer.train_data import trainable
from rollout.arguments import eval_data_keys
from rollout.context import RolloutContext, running
from rollout.continuous import ContinuousRollout
from rollout.debug_data import load_rollout_data, save_rollout_data
from rollout.eval_config import dataset_configs
from rollout.eval_hooks import all_dataset_hooks, close_dataset_hooks
from rollout.evaluation import eval_sampling_params, evaluate_datasets, load_eval_dataset
from rollout.fleet import EngineFleet
from rollout.fleet_plan import expose_routers, plan_fleets, start_fleets
from rollout.generate import sampling_params_from_args
from rollout.hooks import RolloutHooks, load_hooks
from rollout.log_hooks import log_eval, log_rollout
from rollout.metrics import rollout_metrics
from rollout.pause import check_server_args
from rollout.postprocess import finish_rollout
from rollout.sampling import generate_rollout
from rollout.train_handoff import RolloutResult, TrainLayout, hand_off
from slime_like.core.cluster import Slot
from slime_like.core.errors import PluginError
from slime_like.core.logs import setup_logging
from slime_like.core.sample import Sample

logger = logging.getLogger(__name__)

DATA_SOURCE_METHODS = ("get_groups", "state_dict", "load_state_dict")


def load_dataset(args: Any, path: str, tokenizer: Any, evaluation: bool = False) -> PromptDataset:
    """A prompt dataset configured by the data flags (eval datasets by --eval-input-key/--eval-label-key)."""
    input_key, label_key = eval_data_keys(args) if evaluation else (args.input_key, args.label_key)
    return PromptDataset(
        path,
        input_key=input_key,
        label_key=label_key,
        metadata_key=args.metadata_key,
        tool_key=_tool_key(args, evaluation),
        tokenizer=tokenizer,
        apply_chat_template=args.apply_chat_template,
        chat_template_kwargs=getattr(args, "apply_chat_template_kwargs", None),
        max_prompt_len=_max_prompt_len(args, evaluation),
        skip_bad_rows=args.skip_bad_rows,
        **multimodal_dataset_kwargs(args),  # --multimodal-keys: images and the processor (buffer/multimodal.py)
    )


def _tool_key(args: Any, evaluation: bool) -> str | None:
    """The row key of tools: --tool-key; for eval datasets --eval-tool-key, else --tool-key (as slime)."""
    tool_key = getattr(args, "tool_key", None)
    return (getattr(args, "eval_tool_key", None) or tool_key) if evaluation else tool_key


def _max_prompt_len(args: Any, evaluation: bool) -> int | None:
    """Longer prompts are skipped: --rollout-max-prompt-len; for eval datasets --eval-max-prompt-len if given."""
    eval_len = getattr(args, "eval_max_prompt_len", None) if evaluation else None
    return eval_len if eval_len is not None else args.rollout_max_prompt_len


def check_groups(groups: Any, flag: str) -> list[list[Sample]]:
    """A plugin's groups must be a list of lists of Samples."""
    if not isinstance(groups, list) or not all(
        isinstance(g, list) and all(isinstance(s, Sample) for s in g) for g in groups
    ):
        raise TypeError(f"{flag} must return a list of groups, each a list of Samples")
    return groups


class RolloutManager:
    """Generates rollouts and evals from the buffer through the engine fleet (rollout/fleet.py), which it owns;
    `generate` returns one rollout's groups, `evaluate` eval metrics.

    With `server_urls` (and optionally `router_url`) it uses servers started elsewhere and never stops them.
    """

    def __init__(
        self,
        args: Any,
        rollout_slots: list[Slot] | None = None,
        use_gpu: bool = False,
        env: dict[str, str] | None = None,
        server_urls: list[str] | None = None,
        router_url: str | None = None,
    ) -> None:
        from transformers import AutoTokenizer

        self.args = args
        setup_logging("rollout", args.log_level, Path(args.output_dir) / "logs")
        # Plugins and data load first, so their errors come before any server starts.
        self.hooks: RolloutHooks = load_hooks(args)
        self.tokenizer = AutoTokenizer.from_pretrained(args.hf_checkpoint)
        self.data_skipped: dict[str, int] = {}
        self.buffer = Buffer(self._data_source(), self.hooks.buffer_filter, args)
        # Each eval dataset read with its own keys, generated and scored by its own functions (rollout/eval_config.py).
        self.eval_datasets = {c.name: load_eval_dataset(args, c, self.tokenizer) for c in dataset_configs(args)}
        self.eval_hooks = all_dataset_hooks(args, self.hooks, dataset_configs(args))
        planned = plan_fleets(args, rollout_slots or [])  # --sglang-config's models, else the policy alone
        self.fleets: dict[str, EngineFleet] = {fleet.spec.name: fleet for fleet, _ in planned}
        self.fleet = planned[0][0]  # the policy's: it generates the rollouts and alone takes weight updates
        # Our own event loop thread: the caller (a Ray actor) may already be running one.
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="rollout-loop", daemon=True).start()
        if server_urls is not None:
            self.fleet.attach(server_urls, router_url)
            if getattr(args, "rollout_external_engine_addrs", None):  # the run's policy engines, as if started here
                self.fleet.set_weight_version(0)
                expose_routers(args, self.fleets)
        elif not args.debug_train_only:  # --debug-train-only replays saved rollouts: no servers
            start_fleets(planned, use_gpu, env or {})
            expose_routers(args, self.fleets)

    def _data_source(self) -> Any:
        """--data-source-path's source, or the epoch-shuffled --prompt-data source."""
        if self.hooks.data_source_factory is not None:
            source = self.hooks.data_source_factory(self.args, self.tokenizer)
            missing = [m for m in DATA_SOURCE_METHODS if not callable(getattr(source, m, None))]
            if missing:
                raise PluginError(
                    f"--data-source-path={self.args.data_source_path!r}: the object it made has no {', '.join(missing)}"
                )
            return source
        dataset = load_dataset(self.args, self.args.prompt_data, self.tokenizer)
        self.data_skipped = dict(dataset.skipped)
        return DataSource(
            dataset, self.args.n_samples_per_prompt, shuffle=self.args.rollout_shuffle, seed=self.args.rollout_seed
        )

    # The engine fleet's part of the manager's Ray interface (slime_like/run.py calls these).

    def server_urls(self) -> list[str]:
        """Base URLs of the SGLang servers (for weight updates)."""
        return self.fleet.server_urls()

    def set_weight_version(self, version: int) -> None:
        """Tag the servers' current weights (samples record it)."""
        self.fleet.set_weight_version(version)

    def engine_layout(self) -> list[dict[str, Any]]:
        """Each engine's URL, and per node rank its Ray node id and SGLang pid (placement lines, tests)."""
        return self.fleet.layout()

    def router_info(self) -> dict[str, Any]:
        """The router's URL, its process's pid (None for one started elsewhere) and the workers it lists."""
        return self.fleet.router_info()

    def model_groups(self) -> dict[str, dict[str, Any]]:
        """Each served model (--sglang-config): its router, whether it takes weight updates, its engines."""
        return {
            name: {"router": f.router_url, "update_weights": f.spec.update_weights, "engines": f.layout()}
            for name, f in self.fleets.items()
        }

    def paths_unseen(self, path: str) -> list[str]:
        """The engine nodes on which `path` does not exist (the disk transport needs a shared filesystem)."""
        return self.fleet.paths_unseen(path)

    def recover_engines(self) -> list[str]:
        """Before a weight update: dead engines restart (rollout/fleet.py); every engine's URL."""
        for fleet in self.fleets.values():
            if fleet is not self.fleet:
                fleet.heal()  # frozen groups heal themselves on failure; this catches a restart that failed
        return self.fleet.recover()

    def engines_behind(self) -> list[str]:
        """The URLs of live engines without the current weights (restarted, out of the router until they get them)."""
        return self.fleet.behind()

    def engine_verdict(self, urls: list[str], cause: str) -> list[str]:
        """A weight update failed: the engines of `urls` the fleet still counts alive (dead ones taken out)."""
        return self.fleet.verdict(urls, cause)

    def rejoin_engines(self, version: int | None = None) -> int:
        """After a weight update to `version`: restarted engines that hold it join the router; how many joined."""
        return self.fleet.rejoin(version)

    def release_memory(self) -> None:
        """Colocated on GPU: free the servers' weights and KV cache while the trainer runs."""
        self.fleet.release_memory()

    def resume_memory(self) -> None:
        """Colocated on GPU: take the memory back before weights are updated and generation resumes."""
        self.fleet.resume_memory()

    def _run_checked(self, coro: Awaitable[Any], what: str) -> Any:
        """Run `coro` on the loop; EngineError naming the router if it is gone after `what`, failed or not."""
        try:
            result = self._run(coro)
        except Exception as exc:
            self.fleet.check_router_after(what, exc)
            raise
        self.fleet.check_router_after(what)
        return result

    @asynccontextmanager
    async def _context(self, evaluation: bool = False, rollout_id: int | None = None) -> AsyncIterator[RolloutContext]:
        """A RolloutContext with a fresh HTTP session for one rollout or eval, current while it runs."""
        servers = len(self.fleet.server_urls())
        concurrency = self.args.sglang_server_concurrency * max(1, servers)
        timeout = aiohttp.ClientTimeout(total=self.args.rollout_request_timeout)
        connector = aiohttp.TCPConnector(limit=concurrency + 2 * servers)  # room for aborts
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            ctx = RolloutContext(
                self.args,
                self.tokenizer,
                self.fleet.router_url,
                session,
                asyncio.Semaphore(concurrency),
                server_urls=self.server_urls(),
                hooks=self.hooks,
                evaluation=evaluation,
                rollout_id=rollout_id,
                loop=asyncio.get_running_loop(),
                request_failed=self.fleet.request_failed,
            )
            self.fleet.follow(ctx)  # a restarted router that moves port updates ctx.router_url
            try:
                with running(ctx):  # plugins written for slime find it (rollout.context.current_context)
                    yield ctx
            finally:
                self.fleet.unfollow(ctx)

    def generate(self, rollout_id: int) -> tuple[list[list[Sample]], dict[str, Any]]:
        """Generate, score and filter `--rollout-batch-size` groups (or load them, with --load-debug-rollout-data);
        returns them with metrics."""
        if self.args.load_debug_rollout_data is not None:
            args = self.args
            groups = load_rollout_data(args.load_debug_rollout_data, rollout_id, args.load_debug_rollout_data_subsample)
            return self._finish(rollout_id, groups, rollout_metrics(groups, args.reward_key, args=args))
        start = time.monotonic()
        groups, counters = self._run_checked(_rollout(self, rollout_id), f"rollout {rollout_id}")
        metrics = rollout_metrics(groups, self.args.reward_key, args=self.args)
        default_keys = set(metrics)
        elapsed = time.monotonic() - start
        metrics.update({f"rollout/{k}": v for k, v in counters.items()})
        metrics["rollout/time"] = elapsed
        metrics["rollout/tokens_per_s"] = metrics["rollout/generated_tokens"] / max(elapsed, 1e-9)
        metrics = log_rollout(self.hooks.rollout_log, self.args, rollout_id, groups, metrics, default_keys, elapsed)
        return self._finish(rollout_id, groups, metrics)

    # How the trainer takes a rollout (set_train_layout); None until then, and without a trainer.
    _train_layout: TrainLayout | None = None

    def set_train_layout(self, layout: TrainLayout) -> None:
        """The trainer's data-parallel layout: rollouts handed off for training are split for it here."""
        self._train_layout = layout

    def train_batch(self, rollout_id: int) -> RolloutResult:
        """`generate`, keeping the samples here: the driver gets metrics, a failure summary and one object ref
        per trainer DP rank (rollout/train_handoff.py)."""
        return self._hand_off(rollout_id, *self.generate(rollout_id))

    def next_train_batch(self, rollout_id: int) -> RolloutResult:
        """--fully-async: `next_batch`, handed off as `train_batch`."""
        return self._hand_off(rollout_id, *self.next_batch(rollout_id))

    def _hand_off(self, rollout_id: int, groups: list[list[Sample]], metrics: dict[str, Any]) -> RolloutResult:
        args, convert = self.args, self.hooks.convert_samples
        return hand_off(
            rollout_id, groups, metrics, self._train_layout, args.reward_key, args.save_debug_train_data,
            convert=(lambda groups: convert(args, groups)) if convert is not None else None,
            shaping=RewardShaping.from_args(args),  # group baselines here, where every group is whole
        )  # fmt: skip

    def _finish(
        self, rollout_id: int, groups: list[list[Sample]], metrics: dict[str, Any]
    ) -> tuple[list[list[Sample]], dict[str, Any]]:
        """A step's groups with the metrics every loop reports (buffer, engine and router failures, skipped data),
        dumped with --save-debug-rollout-data."""
        metrics["rollout/buffer_groups"] = len(self.buffer)
        for fleet in self.fleets.values():
            group = "" if fleet is self.fleet else f"{fleet.spec.name}/"
            metrics.update({f"rollout/{group}{k}": v for k, v in fleet.metrics().items()})
        metrics.update({f"data/skipped_{k}": v for k, v in self.data_skipped.items()})
        save_rollout_data(self.args, rollout_id, groups)
        return groups, metrics

    def evaluate(self, rollout_id: int) -> dict[str, Any]:
        """Generation over every eval dataset (greedy by default): mean reward and pass@k per dataset."""
        if not self.eval_datasets and self.hooks.eval_function is None:
            return {}
        start = time.monotonic()
        metrics, groups = self._run_checked(_evaluate(self, rollout_id), f"evaluation at rollout {rollout_id}")
        metrics["eval/time"] = time.monotonic() - start
        if groups:
            save_rollout_data(self.args, rollout_id, groups, evaluation=True)
        return log_eval(self.hooks.eval_log, self.args, rollout_id, groups, metrics)

    def _run(self, coro: Awaitable[Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def state_dict(self) -> dict[str, Any]:
        """The buffer's state, saved with the checkpoint (with --fully-async, the groups in flight too)."""
        if self._continuous is not None:
            return self._run(_call(self._continuous.state_dict))
        return self.buffer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the buffer's state."""
        self.buffer.load_state_dict(state)

    def shutdown(self) -> None:
        """Stop the router and every engine this manager started; release the reward backend."""
        for fleet in self.fleets.values():
            fleet.stop_monitors()  # a router stopped from here on is not restarted
        self._stop_continuous()
        try:
            self._run(close_dataset_hooks(self.hooks, self.eval_hooks))
            self._run(self.hooks.close())
        except Exception as exc:  # shutting down: report, then still stop the processes
            logger.warning("closing the reward function: %r", exc)
        for fleet in self.fleets.values():
            fleet.stop()

    # --fully-async: the continuous rollout (rollout/continuous.py) runs on this manager's event loop.
    _continuous: ContinuousRollout | None = None
    _continuous_main: Future[None] | None = None

    def _start_continuous(self, version: int) -> None:
        """Open a rollout context for the rest of the run and start generating on weight `version`."""
        check_server_args(self.server_urls(), self.args.pause_generation_mode)  # servers started elsewhere too
        made: Future[ContinuousRollout] = Future()

        async def main() -> None:
            async with self._context() as ctx:
                rollout = ContinuousRollout(ctx, self.buffer, sampling_params_from_args(self.args), version)
                made.set_result(rollout)
                await rollout.serve()

        self._continuous_main = asyncio.run_coroutine_threadsafe(main(), self._loop)
        wait([made, self._continuous_main], return_when=FIRST_COMPLETED)
        if not made.done():
            self._continuous_main.result()  # it failed before generating: its error
        self._continuous = made.result()

    def next_batch(self, rollout_id: int) -> tuple[list[list[Sample]], dict[str, Any]]:
        """--fully-async: the next `--rollout-batch-size` finished groups, to train at weight version `rollout_id`
        (none over --max-weight-staleness), with the step's metrics; the first call starts the generation."""
        if self._continuous is None:
            self._start_continuous(rollout_id)
        try:
            groups, metrics = self._run(self._continuous.take(rollout_id))
        except Exception as exc:
            self.fleet.check_router_after(f"rollout {rollout_id}", exc)
            raise
        for key, n in self.hooks.reward.drain_counters().items():
            metrics[f"rollout/{key}"] = metrics.get(f"rollout/{key}", 0) + n
        metrics.update(rollout_metrics(groups, self.args.reward_key, args=self.args))
        metrics["rollout/trained_tokens"] = sum(s.response_length for g in groups for s in g if trainable(s))
        return self._finish(rollout_id, groups, metrics)

    def pause_generation(self, mode: str) -> None:
        """--fully-async, before a weight update: pause every server in `mode` (abort, retract, in_place)."""
        if self._continuous is not None:
            self._run(self._continuous.pause(mode, self.fleet.live_urls()))

    def continue_generation(self, version: int) -> None:
        """--fully-async, after a weight update: generation goes on at weight `version`."""
        if self._continuous is not None:
            self._run(self._continuous.resume(version, self.fleet.live_urls()))

    def _stop_continuous(self) -> None:
        """Abort what the continuous rollout still runs (bounded) and close its context."""
        if self._continuous is None:
            return
        try:
            self._run(self._continuous.stop())
            self._continuous_main.result(timeout=60)
        except Exception as exc:  # shutting down: report, then still stop the servers
            logger.warning("stopping the fully-async rollout: %r", exc)
        self._continuous = None


# The manager's coroutines live outside the class: Ray takes a class with an `async def` method for an asyncio
# actor, on whose event loop every blocking ray.get (engine and router calls) warns. Its calls run one at a time
# either way (measured: sync methods of an asyncio actor run one by one on its loop thread).


async def _rollout(manager: RolloutManager, rollout_id: int) -> tuple[list[list[Sample]], dict[str, int]]:
    """One rollout on the manager's loop: generate, score, filter; its groups and counters."""
    async with manager._context(rollout_id=rollout_id) as ctx:
        if manager.hooks.rollout_function is not None:
            # A custom rollout drops groups itself: its draws and returns are counted, not balanced.
            ledger = manager.buffer.open_ledger()
            try:
                groups = await manager.hooks.rollout_function(ctx, rollout_id, manager.buffer)
            finally:
                manager.buffer.close_ledger()
            groups = check_groups(groups, "--rollout-function-path")
            counts = ledger.counts()
            for key in ("groups_drawn", "groups_drawn_source", "groups_drawn_buffer", "groups_returned"):
                ctx.count(key, counts[key])
        else:
            groups = await generate_rollout(ctx, manager.buffer, sampling_params_from_args(manager.args))
        finish_rollout(ctx, groups)
        counters = dict(ctx.counters)
    for key, n in manager.hooks.reward.drain_counters().items():
        counters[key] = counters.get(key, 0) + n
    return groups, counters


async def _evaluate(manager: RolloutManager, rollout_id: int) -> tuple[dict[str, Any], list[list[Sample]]]:
    """One evaluation on the manager's loop: its metrics and groups."""
    async with manager._context(evaluation=True, rollout_id=rollout_id) as ctx:
        if manager.hooks.eval_function is not None:
            metrics = await manager.hooks.eval_function(ctx, rollout_id, manager.eval_datasets)
            if not isinstance(metrics, dict):
                raise TypeError("--eval-function-path must return a dict of metrics")
            return metrics, []
        params = eval_sampling_params(manager.args)
        metrics, groups = await evaluate_datasets(ctx, manager.eval_datasets, params, manager.eval_hooks)
        metrics.update({f"eval/{k}": v for k, v in ctx.counters.items()})
        return metrics, groups


async def _call(fn: Callable[[], Any]) -> Any:
    """fn() on the manager's loop (state that only that loop's thread touches)."""
    return fn()
