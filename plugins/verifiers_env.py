"""Train on a prime-rl `verifiers` environment, unchanged: its turns, tools and rubric run against our endpoint.

    bash scripts/setup-verifiers.sh        # .venv-verifiers: verifiers and its own openai (SGLang pins an older one)
    .venv-verifiers/bin/python -m plugins.verifiers_worker ENV_ID --dump-dataset train.jsonl   # its prompts
    ... --prompt-data train.jsonl --input-key prompt --label-key label --custom-config-path verifiers.yaml \
        --custom-generate-function-path plugins.verifiers_env.generate --custom-rm-path plugins.verifiers_env.reward

with verifiers.yaml (set on args, as slime's --custom-config-path does):

    verifiers_env: my_env                # what verifiers' load_environment takes (a package or a module)
    verifiers_env_args: {max_turns: 3}   # its keyword arguments (optional)
    verifiers_sampling_args: {}          # added to each model call (optional; e.g. extra_body)
    verifiers_python: .venv-verifiers/bin/python   # (optional: the default)
    verifiers_timeout: 300               # seconds per rollout (optional)

verifiers needs openai>=2.9 and SGLang 0.5.15.post1 pins openai==2.6.1, so the environment cannot live in the
rollout's process: one worker process per rollout process (plugins/verifiers_worker.py, started on the first sample)
loads it in .venv-verifiers and runs each sample's rollout there, its model calls going over HTTP to the sample's
session of our OpenAI-compatible endpoint (rollout/openai_endpoint.py). So the sample trains on exactly the ids the
engines received and sampled (plugins/openai_agent.py), and its reward is the environment's rubric score. An
environment that cannot load stops the run with the cause (as any generate function's error does); a worker that
dies fails its samples with its last output and is started again for the next one.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

from plugins.agent_command import signal_group
from plugins.openai_agent import AGENT_TIMEOUT_S, prompt_messages, run_openai_agent
from rollout.context import RolloutContext
from slime_like.core.sample import Sample

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PYTHON = REPO / ".venv-verifiers" / "bin" / "python"
START_TIMEOUT_S = 180.0
RESULT_KEY = "verifiers"  # sample.metadata[RESULT_KEY]: the environment's reward, metrics and stop condition


class WorkerError(RuntimeError):
    """The verifiers worker could not start, or exited."""


class VerifiersWorker:
    """One worker process serving an environment's rollouts; answers resolve the futures of the loops that asked."""

    def __init__(self, python: str, env_id: str, env_args: dict[str, Any]) -> None:
        if not Path(python).exists():
            raise WorkerError(
                f"verifiers_python {python} does not exist: run `bash scripts/setup-verifiers.sh` (it makes "
                ".venv-verifiers) or set verifiers_python to a Python with verifiers installed"
            )
        self.name = env_id
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        cmd = [python, "-m", "plugins.verifiers_worker", env_id, "--env-args", json.dumps(env_args)]
        # Its own session (as an agent command's): a Ctrl-C in the terminal reaches the run, which closes the
        # worker's stdin, and close() reaches whatever the environment started.
        self.proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
        self.tail: collections.deque[str] = collections.deque(maxlen=30)  # its last stderr lines, for errors
        self.pending: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self.lock = threading.Lock()
        self.next_id = 0
        self.ready = threading.Event()
        self.failure: str | None = None
        threading.Thread(target=self._read_stderr, daemon=True).start()
        threading.Thread(target=self._read_stdout, daemon=True).start()
        if not self.ready.wait(START_TIMEOUT_S) and self.failure is None:
            self.close()
            self.failure = f"the verifiers worker for {env_id!r} was not ready after {START_TIMEOUT_S:g}s"
        if self.failure is not None:
            raise WorkerError(self.failure)

    @property
    def alive(self) -> bool:
        """Whether the process still serves."""
        return self.failure is None and self.proc.poll() is None

    async def run(self, request: dict[str, Any]) -> dict[str, Any]:
        """One rollout of the environment: the worker's answer to `request` (an id is added)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self.lock:
            if not self.alive:
                raise WorkerError(self.failure or "the verifiers worker has exited")
            request_id = self.next_id = self.next_id + 1
            self.pending[request_id] = (loop, future)
            try:
                self.proc.stdin.write(json.dumps({**request, "id": request_id}) + "\n")  # type: ignore[union-attr]
                self.proc.stdin.flush()  # type: ignore[union-attr]
            except OSError as exc:  # it exited since the check: its reader thread says why
                self.pending.pop(request_id)
                raise WorkerError(self.failure or f"the verifiers worker has exited ({exc})") from exc
        try:
            return await future
        finally:
            with self.lock:
                self.pending.pop(request_id, None)  # answered, or given up (a timeout): a late answer is dropped

    def close(self) -> None:
        """Stop the process and what it started, its process group (it also stops when our stdin closes)."""
        signal_group(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def _read_stderr(self) -> None:
        for line in self.proc.stderr:  # type: ignore[union-attr]
            self.tail.append(line.rstrip())

    def _read_stdout(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            try:
                message = json.loads(line)
            except ValueError:
                message = None
            if not isinstance(message, dict):  # not the protocol's: kept with its output
                self.tail.append(line.rstrip())
                continue
            if "fatal" in message:
                self.failure = message["fatal"]
            elif message.get("ready"):
                self.ready.set()
            else:
                self._resolve(message.get("id"), lambda f, m=message: f.set_result(m))
        code = self.proc.wait()
        last = "\n".join(self.tail)
        self.failure = self.failure or f"the verifiers worker for {self.name!r} exited with code {code}:\n{last}"
        self.ready.set()
        with self.lock:
            waiting = list(self.pending)
        for request_id in waiting:
            self._resolve(request_id, lambda f: f.set_exception(WorkerError(self.failure)))

    def _resolve(self, request_id: int | None, settle: Any) -> None:
        with self.lock:
            entry = self.pending.get(request_id)  # type: ignore[arg-type]
        if entry is not None:
            loop, future = entry
            try:
                loop.call_soon_threadsafe(lambda: None if future.done() else settle(future))
            except RuntimeError:  # that rollout's loop has closed: nobody waits for this answer any more
                pass


_workers: dict[str, VerifiersWorker] = {}
_workers_lock = threading.Lock()


def worker_for(args: Any) -> VerifiersWorker:
    """The running worker of the run's environment (args.verifiers_*), started or restarted as needed (blocks)."""
    env_id = getattr(args, "verifiers_env", None)
    if not env_id:
        raise ValueError(
            "plugins.verifiers_env needs verifiers_env (the environment to load): set it with --custom-config-path"
        )
    python = str(getattr(args, "verifiers_python", None) or DEFAULT_PYTHON)
    env_args = dict(getattr(args, "verifiers_env_args", None) or {})
    key = json.dumps([python, env_id, env_args], sort_keys=True)
    with _workers_lock:
        worker = _workers.get(key)
        if worker is None or not worker.alive:
            _workers[key] = worker = VerifiersWorker(python, env_id, env_args)
        return worker


async def generate(ctx: RolloutContext, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """--custom-generate-function-path entry point: the environment's rollout of the sample's prompt."""
    args = ctx.args
    worker = await asyncio.get_running_loop().run_in_executor(None, worker_for, args)

    async def environment(base_url: str, api_key: str, sample: Sample) -> None:
        request = {
            "base_url": base_url,
            "api_key": api_key,
            "model": "policy",
            "sampling_args": dict(getattr(args, "verifiers_sampling_args", None) or {}),
            "prompt": prompt_messages(sample.prompt),
            "answer": "" if sample.label is None else str(sample.label),
            "info": sample.metadata.get("info") or {},
            "example_id": sample.metadata.get("example_id", sample.index),
        }
        result = await worker.run(request)
        sample.metadata[RESULT_KEY] = {k: result.get(k) for k in ("reward", "metrics", "stop")}
        if result.get("error") is not None:
            raise RuntimeError(f"the verifiers rollout failed: {result['error']}")

    timeout = float(getattr(args, "verifiers_timeout", None) or AGENT_TIMEOUT_S)
    sample = await run_openai_agent(ctx, sample, sampling_params, environment, timeout=timeout)
    ctx.count("verifiers_rollouts")
    return sample


def reward(args: Any, sample: Sample) -> float:
    """--custom-rm-path: the environment's rubric score of the sample (set by `generate`)."""
    result = sample.metadata.get(RESULT_KEY)
    if not result or result.get("reward") is None:
        raise ValueError(
            f"sample {sample.index} has no verifiers reward: use --custom-generate-function-path "
            "plugins.verifiers_env.generate with --custom-rm-path plugins.verifiers_env.reward"
        )
    return float(result["reward"])
