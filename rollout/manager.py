"""The rollout side of a run: SGLang servers behind one router, the data buffer, generation, rewards and eval."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import ray

from buffer.buffer import Buffer
from buffer.data_source import DataSource, PromptDataset
from buffer.train_data import trainable
from rollout import sglang_client as client
from rollout.arguments import eval_data_keys, server_dtype
from rollout.context import RolloutContext, running
from rollout.continuous import ContinuousRollout
from rollout.debug_data import load_rollout_data, save_rollout_data
from rollout.engines import Engine, EngineLaunch, start_engines, start_router, stop_engines
from rollout.evaluation import eval_sampling_params, evaluate_datasets
from rollout.generate import sampling_params_from_args
from rollout.health import HealthMonitor
from rollout.hooks import RolloutHooks, load_hooks
from rollout.log_hooks import log_eval, log_rollout
from rollout.metrics import rollout_metrics
from rollout.pause import check_server_args
from rollout.postprocess import finish_rollout
from rollout.router import SGLangRouter
from rollout.sampling import generate_rollout
from rollout.train_handoff import RolloutResult, TrainLayout, hand_off
from slime_like.core.cluster import Slot
from slime_like.core.errors import EngineError, PluginError
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
        tool_key=None if evaluation else getattr(args, "tool_key", None),
        tokenizer=tokenizer,
        apply_chat_template=args.apply_chat_template,
        max_prompt_len=args.rollout_max_prompt_len,
        skip_bad_rows=args.skip_bad_rows,
    )


def check_groups(groups: Any, flag: str) -> list[list[Sample]]:
    """A plugin's groups must be a list of lists of Samples."""
    if not isinstance(groups, list) or not all(
        isinstance(g, list) and all(isinstance(s, Sample) for s in g) for g in groups
    ):
        raise TypeError(f"{flag} must return a list of groups, each a list of Samples")
    return groups


class RolloutManager:
    """Owns the servers, the router and the buffer; `generate` returns one rollout's groups, `evaluate` eval metrics.

    With `server_urls` (and optionally `router_url`) it uses servers started elsewhere and never stops them.
    """

    def __init__(
        self,
        args: Any,
        engine_slots: list[list[Slot]] | None = None,
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
        self.eval_datasets = {
            name: load_dataset(args, path, self.tokenizer, evaluation=True)
            for name, path in getattr(args, "eval_datasets", [])
        }
        self.engines: list[Engine] = []
        self._engines_lock = threading.Lock()
        self.monitor: HealthMonitor | None = None
        self.router_monitor: HealthMonitor | None = None  # with --use-fault-tolerance: restarts a dead router
        self.engine_failures = self.engines_restarted = self.router_restarts = 0
        self.router: Any = None  # a local SGLangRouter (external servers) or a RouterHost actor
        # Held while the router is restarted or its workers change (the health threads and the update both do it).
        self._router_lock = threading.RLock()
        self._router_down: str | None = None  # why the router is down and could not be restarted (fault tolerance)
        self._contexts: dict[int, RolloutContext] = {}  # the open ones: told when a restarted router moved
        self._closing = False
        self._external = server_urls is not None
        self._server_urls = list(server_urls or [])
        self._router_url = router_url
        # Our own event loop thread: the caller (a Ray actor) may already be running one.
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="rollout-loop", daemon=True).start()
        if self._external:
            if router_url is None:
                self._start_local_router(Path(args.output_dir) / "logs")
        elif not args.debug_train_only:  # --debug-train-only replays saved rollouts: no servers
            self._start_engines(engine_slots or [], use_gpu, env or {})

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

    def _start_engines(self, engine_slots: list[list[Slot]], use_gpu: bool, env: dict[str, str]) -> None:
        """Start one engine per slot list on its nodes, then the router actor on this node."""
        if not engine_slots:
            raise EngineError("no engine slots given: the placement reserved no rollout GPUs")
        log_dir = str(Path(self.args.output_dir) / "logs")
        launch = EngineLaunch(
            model_path=self.args.hf_checkpoint,
            dtype=server_dtype(self.args),  # the trainer's: else SGLang serves an fp32 checkpoint in fp16
            device="cuda" if use_gpu else "cpu",
            tp=self.args.rollout_num_gpus_per_engine,
            extra_args=list(self.args.sglang_server_args),
            log_dir=log_dir,
            startup_timeout=self.args.sglang_startup_timeout,
        )
        self._launch, self._use_gpu, self._env, self._log_dir = launch, use_gpu, env, log_dir
        self.engines = start_engines(launch, engine_slots, use_gpu, env)
        try:
            self._server_urls = [e.url for e in self.engines]
            self.router, self._router_url = start_router(self._server_urls, self.args.router_policy, log_dir, env)
            for engine in self.engines:
                logger.info("%s", engine.describe())
            self.set_weight_version(0)
        except BaseException:
            self.shutdown()
            raise
        if self.args.use_fault_tolerance:
            self.monitor = HealthMonitor(
                lambda: [e for e in self.engines if not e.dead and not e.joining],
                self._check_engine,
                self._engine_failed,
                self.args.rollout_health_check_interval,
                self.args.rollout_health_check_first_wait,
            )
            self.monitor.start()
            # Its own thread: a hung engine's check must not delay it, and a failed request wakes it at once.
            self.router_monitor = HealthMonitor(
                lambda: [self._router_url],
                self._check_router,
                self._router_failed,
                self.args.rollout_health_check_interval,
                name="router-health",
            )
            self.router_monitor.start()

    def _check_engine(self, engine: Engine) -> None:
        """Raise unless every node's SGLang process runs and node rank 0 generates within the timeout."""
        timeout = self.args.rollout_health_check_timeout
        if not all(ray.get([a.alive.remote() for a in engine.parts], timeout=timeout)):
            raise EngineError(f"{engine.describe()}: its SGLang process exited")
        client.health_generate(engine.url, timeout)

    def _probe(self, engine: Engine) -> Exception | None:
        """The health check's failure, or None."""
        try:
            self._check_engine(engine)
        except Exception as error:  # any failure means the engine cannot serve
            return error
        return None

    def _engine_failed(self, engine: Engine, error: Exception) -> None:
        """Take a failed engine out of the router and stop its processes; it restarts before the next update."""
        with self._engines_lock:
            if engine.dead or engine not in self.engines:
                return
            engine.dead = True
            self.engine_failures += 1
        logger.warning("%s failed its health check (%s): taken out of the router, restarted before the next "
                       "weight update", engine.describe(), error)  # fmt: skip
        try:
            ray.get(self.router.remove_worker.remote(engine.url), timeout=60)
        except Exception as exc:  # the router may have dropped it already
            logger.warning("removing %s from the router: %r", engine.url, exc)
        stop_engines([engine], timeout=30)

    def _check_router(self, url: str, timeout: float | None = None) -> None:
        """Raise unless the router answers /health within `timeout` (default: the health check timeout)."""
        client.get(url, "/health", timeout=timeout or self.args.rollout_health_check_timeout)

    def _router_answers(self) -> bool:
        """Whether the router answers /health now (a second look after a failure: a hung one has had its time)."""
        try:
            self._check_router(self._router_url, timeout=min(5.0, self.args.rollout_health_check_timeout))
        except EngineError:
            return False
        return True

    def _router_failed(self, url: str, error: Exception) -> None:
        """The router failed its health check: restart it, unless it was restarted since the check began."""
        with self._router_lock:
            if self._closing or url != self._router_url or self._router_answers():
                return  # shutting down, or restarted since the check began (the port may have moved)
            self._restart_router(error)

    def _restart_router(self, error: Exception) -> None:
        """(Router lock held.) A new router process in place of the dead one (in a new actor if its actor died too),
        on its port when free, and every live engine registered with it again (restarted ones waiting for their
        first update join in `rejoin_engines`)."""
        old = self._router_url
        try:
            try:
                url, code = ray.get(self.router.restart.remote(), timeout=300)
                died = "was hung and was stopped" if code is None else f"exited with code {code}"
            except ray.exceptions.RayActorError as exc:  # the router process died with it: a new actor, same node
                port = urlsplit(old).port
                self.router, url = start_router([], self.args.router_policy, self._log_dir, self._env, port)
                died = f"died with its Ray actor ({type(exc).__name__})"
        except Exception as exc:
            self._router_down = f"sglang-router at {old} failed ({error}) and could not be restarted: {exc}"
            raise EngineError(self._router_down) from exc
        self._router_down = None
        self.router_restarts += 1
        if url != old:  # the old port was taken: every request from now on goes to the new one
            self._router_url = url
            for ctx in list(self._contexts.values()):
                ctx.router_url = url
        live = [e for e in self.engines if not e.dead and not e.joining]
        for engine in live:
            try:
                ray.get(self.router.add_worker.remote(engine.url), timeout=120)
            except Exception as exc:  # it does not pass the router's check: restarted at the next weight update
                self._engine_failed(engine, exc)
        logger.warning("sglang-router at %s failed (%s; its process %s): router restarted at %s with %d engine(s) "
                       "registered again (restart %d)", old, error, died, url, len(live), self.router_restarts)  # fmt: skip

    def _request_failed(self) -> None:
        """A request through the router failed: with fault tolerance check the router now."""
        if self.router_monitor is not None:
            self.router_monitor.wake()

    def _router_failure(self) -> str | None:
        """Why the router is gone (then the rollout cannot go on), or None: without fault tolerance, its process
        exited; with it, it could not be restarted."""
        if self.router_monitor is not None:
            with self._router_lock:
                if self._router_down is not None and not self._closing:
                    # The health thread will try again, but this rollout needs an answer now: one more attempt.
                    with suppress(EngineError):
                        self._restart_router(EngineError(self._router_down))
                return self._router_down
        if isinstance(self.router, SGLangRouter):
            code = self.router.process.returncode if self.router.process else None
        elif self.router is not None:
            try:
                code = ray.get(self.router.returncode.remote(), timeout=60)
            except Exception as exc:  # its actor is gone, and the router process with it
                return f"sglang-router at {self._router_url} is gone with its Ray actor ({exc!r})"
        else:
            return None  # a router started elsewhere: not ours to watch
        if code is None:
            return None
        return (
            f"sglang-router at {self._router_url} exited with code {code}: every request through it fails "
            "(see its log under --output-dir/logs; --use-fault-tolerance restarts it)"
        )

    def _check_router_after(self, what: str, error: BaseException | None = None) -> None:
        """Raise EngineError naming the router if it is gone after `what` (from `error`, the failure it caused)."""
        failure = self._router_failure()
        if failure is not None:
            raise EngineError(f"{what}: {failure}") from error

    def _run_checked(self, coro: Awaitable[Any], what: str) -> Any:
        """Run `coro` on the loop; EngineError naming the router if it is gone after `what`, failed or not."""
        try:
            result = self._run(coro)
        except Exception as exc:
            self._check_router_after(what, exc)
            raise
        self._check_router_after(what)
        return result

    def recover_engines(self) -> list[str]:
        """Before a weight update: pause the health checks, check every engine once more, restart every dead one on
        its slots (out of the router until `rejoin_engines`); returns every engine's URL, the restarted ones' new."""
        for monitor in (self.monitor, self.router_monitor):
            if monitor is not None:
                monitor.pause()
        # One that died since the last check must not take the update down with it: check all, side by side
        # (/health_generate takes a second or more each).
        live = [e for e in self.engines if not e.dead]
        with ThreadPoolExecutor(max_workers=max(1, len(live))) as pool:
            errors = list(pool.map(self._probe, live))
        for engine, error in zip(live, errors, strict=True):
            if error is not None:
                self._engine_failed(engine, error)
        with self._engines_lock:
            dead = [e for e in self.engines if e.dead]
        if dead:
            slots = [[slot for part in e.slots for slot in part] for e in dead]
            fresh = start_engines(self._launch, slots, self._use_gpu, self._env, [e.index for e in dead])
            with self._engines_lock:
                for new in fresh:
                    new.joining = True
                    self.engines[new.index] = new
                    logger.info("restarted %s; it serves after this weight update", new.describe())
            self.engines_restarted += len(fresh)
            self._server_urls = [e.url for e in self.engines]
        return self.server_urls()

    def rejoin_engines(self) -> int:
        """After a weight update: restarted engines (now at the trainer's weights) join the router; the health
        checks resume. Returns how many joined."""
        with self._router_lock:
            joining = [e for e in self.engines if e.joining]
            for engine in joining:
                engine.joining = False
            try:
                for engine in joining:
                    ray.get(self.router.add_worker.remote(engine.url))
            except Exception as exc:
                if self._router_answers():
                    raise  # the engine's fault, not the router's
                self._restart_router(exc)  # registers every live engine, these included
        for monitor in (self.monitor, self.router_monitor):
            if monitor is not None:
                monitor.resume()
        return len(joining)

    def _start_local_router(self, log_dir: Path) -> None:
        from rollout.router import SGLangRouter

        log_dir.mkdir(parents=True, exist_ok=True)
        self.router = SGLangRouter(self._server_urls, policy=self.args.router_policy, log_dir=log_dir)
        self.router.start()
        self._router_url = self.router.url

    def engine_layout(self) -> list[dict[str, Any]]:
        """Each engine's URL, and per node rank its Ray node id and SGLang pid (placement lines, tests)."""
        return [{"url": e.url, "nodes": [p[0].node_id for p in e.slots], "pids": list(e.pids)} for e in self.engines]

    def router_info(self) -> dict[str, Any]:
        """The router's URL, its process's pid (None for one started elsewhere) and the workers it lists."""
        if self._router_url is None:  # --debug-train-only: no servers, no router
            return {"url": None, "pid": None, "workers": []}
        if isinstance(self.router, SGLangRouter):
            pid = self.router.process.pid if self.router.process else None
        else:
            pid = ray.get(self.router.pid.remote(), timeout=60) if self.router is not None else None
        return {"url": self._router_url, "pid": pid, "workers": client.list_workers(self._router_url)}

    def paths_unseen(self, path: str) -> list[str]:
        """The engine nodes on which `path` does not exist (the disk transport needs a shared filesystem)."""
        unseen = []
        for engine in self.engines:
            seen = ray.get([a.sees.remote(path) for a in engine.parts])
            unseen += [f"{engine.url} ({p[0].describe()})" for p, ok in zip(engine.slots, seen, strict=True) if not ok]
        return unseen

    def server_urls(self) -> list[str]:
        """Base URLs of the SGLang servers (for weight updates)."""
        return list(self._server_urls)

    def set_weight_version(self, version: int) -> None:
        """Tag the servers' current weights (samples record it)."""
        client.on_all(self.server_urls(), client.set_weight_version, version)

    @asynccontextmanager
    async def _context(self, evaluation: bool = False, rollout_id: int | None = None) -> AsyncIterator[RolloutContext]:
        """A RolloutContext with a fresh HTTP session for one rollout or eval, current while it runs."""
        concurrency = self.args.sglang_server_concurrency * max(1, len(self._server_urls))
        timeout = aiohttp.ClientTimeout(total=self.args.rollout_request_timeout)
        connector = aiohttp.TCPConnector(limit=concurrency + 2 * len(self._server_urls))  # room for aborts
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            ctx = RolloutContext(
                self.args,
                self.tokenizer,
                self._router_url,
                session,
                asyncio.Semaphore(concurrency),
                server_urls=self.server_urls(),
                hooks=self.hooks,
                evaluation=evaluation,
                rollout_id=rollout_id,
                loop=asyncio.get_running_loop(),
                request_failed=self._request_failed,
            )
            self._contexts[id(ctx)] = ctx
            ctx.router_url = self._router_url  # registered first: a router that moves from now on updates it
            try:
                with running(ctx):  # plugins written for slime find it (rollout.context.current_context)
                    yield ctx
            finally:
                self._contexts.pop(id(ctx), None)

    def generate(self, rollout_id: int) -> tuple[list[list[Sample]], dict[str, Any]]:
        """Generate, score and filter `--rollout-batch-size` groups (or load them, with --load-debug-rollout-data);
        returns them with metrics."""
        if self.args.load_debug_rollout_data is not None:
            args = self.args
            groups = load_rollout_data(args.load_debug_rollout_data, rollout_id, args.load_debug_rollout_data_subsample)
            return self._finish(rollout_id, groups, rollout_metrics(groups, args.reward_key))
        start = time.monotonic()
        groups, counters = self._run_checked(_rollout(self, rollout_id), f"rollout {rollout_id}")
        metrics = rollout_metrics(groups, self.args.reward_key)
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
        )  # fmt: skip

    def _finish(
        self, rollout_id: int, groups: list[list[Sample]], metrics: dict[str, Any]
    ) -> tuple[list[list[Sample]], dict[str, Any]]:
        """A step's groups with the metrics every loop reports (buffer, engine and router failures, skipped data),
        dumped with --save-debug-rollout-data."""
        metrics["rollout/buffer_groups"] = len(self.buffer)
        if self.monitor is not None:
            metrics["rollout/engine_failures"] = self.engine_failures
            metrics["rollout/engines_restarted"] = self.engines_restarted
            metrics["rollout/router_restarts"] = self.router_restarts
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

    def release_memory(self) -> None:
        """Colocated on GPU: free the servers' weights and KV cache while the trainer runs."""
        client.on_all(self.server_urls(), client.release_memory)

    def resume_memory(self) -> None:
        """Colocated on GPU: take the memory back before weights are updated and generation resumes."""
        client.on_all(self.server_urls(), client.resume_memory)

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
        self._closing = True  # a router stopped from here on is not restarted
        for monitor in (self.monitor, self.router_monitor):
            if monitor is not None:
                monitor.stop()
        self._stop_continuous()
        try:
            self._run(self.hooks.close())
        except Exception as exc:  # shutting down: report, then still stop the processes
            logger.warning("closing the reward function: %r", exc)
        with self._router_lock:  # after a restart still under way
            if isinstance(self.router, SGLangRouter):
                self.router.stop()
            elif self.router is not None:
                try:
                    ray.get(self.router.stop.remote(), timeout=30)
                except Exception as exc:  # its node may be gone, and the router with it
                    logger.warning("stopping the router: %r", exc)
                ray.kill(self.router)
            self.router = None
        stop_engines(self.engines)
        self.engines = []

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
            self._check_router_after(f"rollout {rollout_id}", exc)
            raise
        for key, n in self.hooks.reward.drain_counters().items():
            metrics[f"rollout/{key}"] = metrics.get(f"rollout/{key}", 0) + n
        metrics.update(rollout_metrics(groups, self.args.reward_key))
        metrics["rollout/trained_tokens"] = sum(s.response_length for g in groups for s in g if trainable(s))
        return self._finish(rollout_id, groups, metrics)

    def pause_generation(self, mode: str) -> None:
        """--fully-async, before a weight update: pause every server in `mode` (abort, retract, in_place)."""
        if self._continuous is not None:
            self._run(self._continuous.pause(mode, self.server_urls()))

    def continue_generation(self, version: int) -> None:
        """--fully-async, after a weight update: generation goes on at weight `version`."""
        if self._continuous is not None:
            self._run(self._continuous.resume(version, self.server_urls()))

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
        metrics, groups = await evaluate_datasets(ctx, manager.eval_datasets, eval_sampling_params(manager.args))
        metrics.update({f"eval/{k}": v for k, v in ctx.counters.items()})
        return metrics, groups


async def _call(fn: Callable[[], Any]) -> Any:
    """fn() on the manager's loop (state that only that loop's thread touches)."""
    return fn()
