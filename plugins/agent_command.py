"""An agent is a command: any executable runs once per sample against that sample's session of the rollout's endpoint.

    --custom-generate-function-path plugins.agent_command.generate --custom-config-path agent.yaml
    [--custom-rm-path plugins.agent_command.answer_file_reward]

with agent.yaml (each key is set on args, as slime's --custom-config-path does; an unknown agent_command_* key is an
error, never ignored):

    agent_command: [/opt/agent/.venv/bin/python, /opt/agent/main.py, "{task_file}"]  # argv (a string: split as sh)
    agent_command_task: file              # how the task goes in: file (only {task_file}), arg (the last argument,
                                          # or where {task} stands), stdin (written, then closed)
    agent_command_task_format: text       # text (a message list's contents, blank-line separated) or messages (JSON)
    agent_command_env: {MY_FLAG: "1", PYTHONPATH: null}   # set in the run's environment (null removes a variable)
    agent_command_timeout: 300            # seconds; then SIGTERM to its process group, SIGKILL after the grace
    agent_command_kill_grace: 5           # seconds
    agent_command_keep_files: [answer.txt, "logs/*.json"]  # globs in its working directory, read into the metadata
    agent_command_max_file_bytes: 65536   # per kept file (the rest is cut; its name goes in truncated_files)
    agent_command_output_bytes: 8192      # how much of the end of stdout, and of stderr, is kept
    agent_command_workdir: DIR            # where the working directories go (default <output-dir>/agent_command)
    agent_command_keep_workdir: false     # else each is deleted once its files are read
    agent_command_answer_file: answer.txt # the file answer_file_reward compares with the label

The argv and the env values may hold {workdir} and {task_file}; the argv also {task} (agent_command_task: arg).
The program is found from the run's directory (or on PATH); its arguments are read from its working directory.
Each sample runs in a fresh working directory (its cwd) holding the task file (task.txt, or task.json for messages),
with OPENAI_BASE_URL (the session's `http://127.0.0.1:PORT/s/<session>/v1`), OPENAI_API_KEY, ANTHROPIC_BASE_URL (the
same without /v1: the Anthropic SDK adds /v1/messages itself), ANTHROPIC_API_KEY, AGENT_WORKDIR and AGENT_TASK_FILE
added to the run's environment (these win over agent_command_env), and 127.0.0.1 added to NO_PROXY. It starts in a
session of its own, so its whole process group is killed on timeout, when the rollout aborts or is cancelled, and
after it exits (what it left running); a process that starts its own session (a daemon) leaves the group.

The sample trains on the ids the engines received and sampled in its session (plugins/openai_agent.py). What the
command did is in sample.metadata["agent_command"] for the reward function: exit_code (negative: the signal that
ended it), timed_out, aborted, stdout and stderr (their tails), files ({relative path: text}), truncated_files,
workdir (when kept, else None) and seconds. A non-zero exit, a timeout or no model call marks the sample FAILED with
the reason in metadata["agent_error"] (rollout/agent_command_failed, rollout/agent_command_timeout); the rollout goes
on. An agent killed by the rollout's abort leaves the sample ABORTED: it runs again from the prompt. A command that is
not an executable, or settings that cannot run, stop the run at the first sample naming the key and the path.
"""

from __future__ import annotations

import asyncio
import atexit
import fnmatch
import json
import os
import re
import shlex
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from plugins.openai_agent import AGENT_TIMEOUT_S, prompt_messages, run_openai_agent
from rollout.context import RolloutContext
from slime_like.core.process import die_with_parent, group_has_live_members
from slime_like.core.sample import Sample, Status

RESULT_KEY = "agent_command"  # sample.metadata[RESULT_KEY]: what the command did, for the reward
TASK_MODES = ("file", "arg", "stdin")
TASK_FORMATS = ("text", "messages")
DEFAULT_ANSWER_FILE = "answer.txt"
MAX_KEPT_FILES = 64  # a glob that matches a whole tree must not copy it into every sample
POLL_S = 0.1
_PLACEHOLDER = re.compile(r"\{(workdir|task_file|task)\}")
_LIVE_GROUPS: set[int] = set()  # process groups of running commands: killed if the process exits under them


class AgentCommandError(RuntimeError):
    """The command failed its sample: a non-zero exit, a timeout, or the rollout's abort."""


class AgentCommandConfigError(ValueError):
    """agent_command_* settings that cannot run: raised from the first sample, it stops the run."""


@dataclass(frozen=True)
class AgentCommandConfig:
    """The agent_command_* settings, checked."""

    command: tuple[str, ...]
    task: str = "file"
    task_format: str = "text"
    env: Mapping[str, str | None] = field(default_factory=dict)
    timeout: float = AGENT_TIMEOUT_S
    kill_grace: float = 5.0
    keep_files: tuple[str, ...] = ()
    max_file_bytes: int = 65536
    output_bytes: int = 8192
    workdir: Path = Path("outputs/run/agent_command")
    keep_workdir: bool = False
    answer_file: str = DEFAULT_ANSWER_FILE

    @classmethod
    def from_args(cls, args: Any) -> AgentCommandConfig:
        """The settings on `args` (from --custom-config-path); AgentCommandConfigError naming the key if wrong."""
        given = {k[len("agent_command_") :]: v for k, v in vars(args).items() if k.startswith("agent_command_")}
        unknown = sorted(set(given) - {f for f in cls.__dataclass_fields__ if f != "command"})
        if unknown:
            names = ", ".join(f"agent_command_{k}" for k in unknown)
            raise AgentCommandConfigError(
                f"unknown setting(s) {names} in --custom-config-path: see plugins/agent_command.py"
            )
        command = getattr(args, "agent_command", None)
        if isinstance(command, str):
            command = shlex.split(command)
        if not command or not isinstance(command, list | tuple) or not all(isinstance(a, str) for a in command):
            raise AgentCommandConfigError(
                "plugins.agent_command needs agent_command (the argv to run, a list of strings): set it with "
                f"--custom-config-path (got {command!r})"
            )
        given = {k: v for k, v in given.items() if v is not None}
        env, keep = given.pop("env", None) or {}, given.pop("keep_files", None) or ()
        if not isinstance(env, Mapping):
            raise AgentCommandConfigError(f"agent_command_env must map variable names to values, not {env!r}")
        settings: dict[str, Any] = {
            "env": dict(env),
            "keep_files": (keep,) if isinstance(keep, str) else tuple(keep),
            "workdir": Path(given.pop("workdir", None) or Path(getattr(args, "output_dir", ".")) / "agent_command"),
        }
        for key, value in given.items():
            kind = type(getattr(cls, key))
            # YAML gives bools and numbers their types; a string where one is wanted is a mistake, not "true".
            if (kind is bool) != isinstance(value, bool) or (kind is not str and isinstance(value, str)):
                raise AgentCommandConfigError(f"agent_command_{key} must be a {kind.__name__}, not {value!r}")
            settings[key] = kind(value)
        config = cls(command=tuple(command), **settings)
        config.check()
        if not _PLACEHOLDER.search(command[0]):
            # Resolved from the run's directory now: the command itself runs in its working directory.
            found = resolve_executable(command[0], config.env.get("PATH", os.environ.get("PATH")))
            config = replace(config, command=(found, *command[1:]))
        return config

    def check(self) -> None:
        """Refuse settings that cannot run, naming the key."""
        if self.task not in TASK_MODES:
            raise AgentCommandConfigError(f"agent_command_task must be one of {TASK_MODES}, not {self.task!r}")
        if self.task_format not in TASK_FORMATS:
            raise AgentCommandConfigError(
                f"agent_command_task_format must be one of {TASK_FORMATS}, not {self.task_format!r}"
            )
        if self.task != "arg" and any("{task}" in a for a in self.command):
            raise AgentCommandConfigError(
                f"agent_command has {{task}} but agent_command_task is {self.task!r}: set agent_command_task: arg"
            )
        if self.timeout <= 0 or self.kill_grace < 0 or self.max_file_bytes < 0 or self.output_bytes < 0:
            raise AgentCommandConfigError("agent_command_timeout must be > 0, and the grace and byte limits >= 0")
        for pattern in self.keep_files:
            if not isinstance(pattern, str) or Path(pattern).is_absolute() or ".." in Path(pattern).parts:
                raise AgentCommandConfigError(
                    f"agent_command_keep_files: {pattern!r} must be a glob relative to the working directory"
                )


def resolve_executable(program: str, path_env: str | None) -> str:
    """argv[0] as the absolute path that will run: a path (from the run's directory) or a name found on PATH."""
    if os.sep in program:
        # abspath, not resolve: a venv's python is a symlink, and run through its target it would not be that venv.
        path = os.path.abspath(os.path.expanduser(program))
        if not os.path.isfile(path):
            raise AgentCommandConfigError(f"agent_command: {path} does not exist (or is not a file)")
        if not os.access(path, os.X_OK):
            raise AgentCommandConfigError(
                f"agent_command: {path} is not executable (chmod +x, or run it with its interpreter)"
            )
        return path
    found = shutil.which(program, path=path_env)
    if found is None:
        raise AgentCommandConfigError(f"agent_command: {program!r} is not an executable on PATH ({path_env})")
    return found


def _text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else json.dumps(content, ensure_ascii=False)


def render_task(prompt: Any, task_format: str) -> str:
    """The sample's prompt as the command's task: text, or the chat messages as JSON."""
    if task_format == "messages":
        return json.dumps(prompt_messages(prompt), ensure_ascii=False)
    if isinstance(prompt, str):
        return prompt
    return "\n\n".join(_text(m.get("content") if isinstance(m, dict) else m) for m in prompt_messages(prompt))


def _fill(text: str, values: Mapping[str, str]) -> str:
    # One pass: a task that itself contains "{workdir}" is not filled in again.
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), text)


def build_argv(command: Sequence[str], task_mode: str, task: str, workdir: Path, task_file: Path) -> list[str]:
    """The argv of one sample: placeholders filled, and the task appended in arg mode when no {task} stands."""
    values = {"workdir": str(workdir), "task_file": str(task_file)}
    if task_mode == "arg":
        values["task"] = task
    argv = [_fill(a, values) for a in command]
    if task_mode == "arg" and not any("{task}" in a for a in command):
        argv.append(task)
    return argv


def build_env(
    base: Mapping[str, str],
    extra: Mapping[str, str | None],
    base_url: str,
    api_key: str,
    workdir: Path,
    task_file: Path,
) -> dict[str, str]:
    """The command's environment: the run's, then agent_command_env, then the session's URLs and key."""
    values = {"workdir": str(workdir), "task_file": str(task_file)}
    env = dict(base)
    for key, value in extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = _fill(str(value), values)
    env.update(
        OPENAI_BASE_URL=base_url,
        OPENAI_API_KEY=api_key,
        ANTHROPIC_BASE_URL=base_url.removesuffix("/").removesuffix("/v1"),
        ANTHROPIC_API_KEY=api_key,
        AGENT_WORKDIR=str(workdir),
        AGENT_TASK_FILE=str(task_file),
    )
    # The endpoint is local: a proxy set for the outside world must not carry the agent's calls.
    for key in ("NO_PROXY", "no_proxy"):
        hosts = [h for h in env.get(key, "").split(",") if h]
        env[key] = ",".join(hosts + [h for h in ("127.0.0.1", "localhost") if h not in hosts])
    return env


class OutputTail:
    """The last `limit` bytes of a stream, and how many it had in all."""

    def __init__(self, limit: int) -> None:
        self.limit, self.total, self.data = limit, 0, bytearray()

    def feed(self, chunk: bytes) -> None:
        """Add what the stream wrote next."""
        self.total += len(chunk)
        self.data += chunk
        if len(self.data) > self.limit:
            del self.data[: len(self.data) - self.limit]

    def text(self) -> str:
        """The tail as text, saying how much was cut before it."""
        cut = self.total - len(self.data)
        body = bytes(self.data).decode("utf-8", "replace")
        return f"[{cut} bytes cut]\n{body}" if cut else body


def last_line(text: str) -> str:
    """The last non-empty line of `text` (for error messages)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def collect_files(workdir: Path, patterns: Sequence[str], max_bytes: int) -> tuple[dict[str, str], list[str]]:
    """The files in `workdir` matching `patterns` as {relative path: text} (each cut at max_bytes), and those cut."""
    root = workdir.resolve()
    files: dict[str, str] = {}
    truncated: list[str] = []
    for pattern in patterns:
        for path in sorted(root.glob(pattern)):
            name = path.relative_to(root).as_posix()
            # A link out of the working directory is not something the agent wrote.
            if name in files or not path.is_file() or not path.resolve().is_relative_to(root):
                continue
            if len(files) >= MAX_KEPT_FILES:
                return files, truncated
            with open(path, "rb") as f:
                data = f.read(max_bytes + 1)
            if len(data) > max_bytes:
                truncated.append(name)
            files[name] = data[:max_bytes].decode("utf-8", "replace")
    return files, truncated


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to process group `pgid`; False when no process is left in it."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


async def stop_group(pgid: int, grace: float) -> None:
    """SIGTERM a process group, then SIGKILL whatever of it is still running `grace` seconds later."""
    if not signal_group(pgid, signal.SIGTERM):
        return
    deadline = time.monotonic() + grace
    while group_has_live_members(pgid):
        if time.monotonic() >= deadline:
            signal_group(pgid, signal.SIGKILL)
            return
        await asyncio.sleep(0.05)


@atexit.register
def _kill_live_groups() -> None:
    # A rollout process that exits mid-sample (its loop is a daemon thread's) must not leave agents running.
    for pgid in list(_LIVE_GROUPS):
        signal_group(pgid, signal.SIGKILL)


@dataclass
class CommandResult:
    """How a command ended and the tails of what it printed."""

    exit_code: int | None
    timed_out: bool
    aborted: bool
    stdout: str
    stderr: str
    seconds: float


async def _pump(stream: asyncio.StreamReader, tail: OutputTail) -> None:
    while chunk := await stream.read(1 << 16):
        tail.feed(chunk)


async def _feed(stdin: asyncio.StreamWriter, data: bytes) -> None:
    try:
        stdin.write(data)
        await stdin.drain()
        stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass  # it exited, or closed its stdin, without reading it all: its choice


async def run_command(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    stdin: bytes | None,
    timeout: float,
    kill_grace: float,
    output_bytes: int,
    should_stop: Callable[[], bool] = lambda: False,
) -> CommandResult:
    """Run argv in its own session until it exits, `timeout` passes or `should_stop()`; its group never outlives it."""
    start = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=dict(env),
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # its own process group: one signal reaches everything it starts
        preexec_fn=die_with_parent(os.getpid()),  # a rollout killed outright (Ray, the OOM killer) takes it along
    )
    _LIVE_GROUPS.add(proc.pid)
    out, err = OutputTail(output_bytes), OutputTail(output_bytes)
    assert proc.stdout is not None and proc.stderr is not None
    helpers = [asyncio.create_task(_pump(proc.stdout, out)), asyncio.create_task(_pump(proc.stderr, err))]
    if stdin is not None:
        assert proc.stdin is not None
        helpers.append(asyncio.create_task(_feed(proc.stdin, stdin)))
    timed_out = aborted = False
    try:
        # Polled, not proc.wait(): on Python 3.11 that waits for the pipes too, which a left-behind child holds.
        while proc.returncode is None:
            if time.monotonic() - start >= timeout:
                timed_out = True
                break
            if should_stop():
                aborted = True
                break
            await asyncio.sleep(POLL_S)
        # It exited, or must go: either way nothing of its group may outlive the sample.
        await stop_group(proc.pid, kill_grace)
        await asyncio.wait(helpers[:2], timeout=2.0)  # the pipes end once the group is gone
        gone_by = time.monotonic() + 5.0
        while proc.returncode is None and time.monotonic() < gone_by:
            await asyncio.sleep(0.02)  # the leader's exit status is collected by the loop's child watcher
    except BaseException:  # cancelled (the rollout stopped, a backstop timeout): no time for a grace period
        signal_group(proc.pid, signal.SIGKILL)
        raise
    finally:
        _LIVE_GROUPS.discard(proc.pid)
        for task in helpers:
            task.cancel()
    return CommandResult(
        exit_code=proc.returncode,
        timed_out=timed_out,
        aborted=aborted,
        stdout=out.text(),
        stderr=err.text(),
        seconds=round(time.monotonic() - start, 3),
    )


async def run_in_workdir(
    config: AgentCommandConfig,
    base_url: str,
    api_key: str,
    sample: Sample,
    *,
    prefix: str,
    should_stop: Callable[[], bool] = lambda: False,
) -> dict[str, Any]:
    """Run the command on `sample`'s task in a fresh working directory; what sample.metadata[RESULT_KEY] holds."""
    config.workdir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=prefix, dir=config.workdir)).resolve()
    try:
        task = render_task(sample.prompt, config.task_format)
        task_file = workdir / ("task.json" if config.task_format == "messages" else "task.txt")
        task_file.write_text(task, encoding="utf-8")
        result = await run_command(
            build_argv(config.command, config.task, task, workdir, task_file),
            cwd=workdir,
            env=build_env(os.environ, config.env, base_url, api_key, workdir, task_file),
            stdin=task.encode() if config.task == "stdin" else None,
            timeout=config.timeout,
            kill_grace=config.kill_grace,
            output_bytes=config.output_bytes,
            should_stop=should_stop,
        )
        files, truncated = await asyncio.to_thread(collect_files, workdir, config.keep_files, config.max_file_bytes)
    finally:
        if not config.keep_workdir:
            await asyncio.to_thread(shutil.rmtree, workdir, True)
    record = asdict(result)
    record.update(files=files, truncated_files=truncated, workdir=str(workdir) if config.keep_workdir else None)
    return record


def config_for(ctx: RolloutContext) -> AgentCommandConfig:
    """The rollout's checked settings (checked once per rollout)."""
    config = ctx.plugin_state.get(RESULT_KEY)
    if config is None:
        config = ctx.plugin_state[RESULT_KEY] = AgentCommandConfig.from_args(ctx.args)
    return config


async def generate(ctx: RolloutContext, sample: Sample, sampling_params: dict[str, Any]) -> Sample | list[Sample]:
    """--custom-generate-function-path entry point: the command on the sample's task, its model calls the trajectory."""
    config = config_for(ctx)  # wrong settings raise here: the run stops with the cause

    async def agent(base_url: str, api_key: str, sample: Sample) -> None:
        sample.metadata.pop(RESULT_KEY, None)  # a sample run again after an abort starts clean
        prefix = f"r{ctx.rollout_id if ctx.rollout_id is not None else 'x'}-s{sample.index}-"
        record = await run_in_workdir(
            config, base_url, api_key, sample, prefix=prefix, should_stop=lambda: ctx.aborting
        )
        sample.metadata[RESULT_KEY] = record
        if record["aborted"]:
            raise AgentCommandError("the agent command was killed: the rollout aborted")
        if record["timed_out"]:
            ctx.count("agent_command_timeout")
            raise AgentCommandError(
                f"the agent command timed out after {config.timeout:g}s; its process group was killed"
            )
        if record["exit_code"] != 0:
            ctx.count("agent_command_failed")
            why = last_line(record["stderr"]) or "(nothing on stderr)"
            raise AgentCommandError(f"the agent command exited with code {record['exit_code']}: {why}")

    # Our own timeout ends the command first; this one only bounds a stop that hangs.
    backstop = config.timeout + 2 * config.kill_grace + 30
    # The sample, or (an agent whose history branched) the sample then its other branches: all returned.
    out = await run_openai_agent(ctx, sample, sampling_params, agent, timeout=backstop)
    ctx.count("agent_command_runs")
    if (sample.metadata.get(RESULT_KEY) or {}).get("aborted") and sample.status != Status.ABORTED:
        # Killed because the rollout aborts (before the endpoint refused a call of it): it runs again later.
        sample.status = Status.ABORTED
        sample.metadata.pop("agent_error", None)
        sample.metadata.pop("generate_error", None)
    return out


def answer_file_reward(args: Any, sample: Sample) -> float:
    """--custom-rm-path: 1.0 when the file the agent left (agent_command_answer_file) holds the label, else 0.0."""
    name = getattr(args, "agent_command_answer_file", None) or DEFAULT_ANSWER_FILE
    kept = list(getattr(args, "agent_command_keep_files", None) or [])
    if not any(fnmatch.fnmatch(name, pattern) for pattern in kept):
        raise ValueError(
            f"agent_command_answer_file {name!r} matches none of agent_command_keep_files {kept}: the reward "
            "cannot see it (add it there)"
        )
    answer = ((sample.metadata.get(RESULT_KEY) or {}).get("files") or {}).get(name)
    return float(answer is not None and sample.label is not None and answer.strip() == str(sample.label).strip())
