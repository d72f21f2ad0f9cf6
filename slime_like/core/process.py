"""Child processes that never outlive the engine: own session, parent-death signal, logs, HTTP readiness."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import os
import queue
import random
import re
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import psutil
import requests

_PR_SET_PDEATHSIG = 1
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_LIVE: set[ManagedProcess] = set()
_LIVE_LOCK = threading.Lock()
_SPAWN_QUEUE: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
_SPAWNER: threading.Thread | None = None


class PortInUseError(RuntimeError):
    """A port the caller asked for is already bound by another process."""


class ProcessStartError(RuntimeError):
    """A managed process died, or did not become ready, while starting."""

    def __init__(self, message: str, pid: int | None, returncode: int | None, log_path: Path) -> None:
        super().__init__(message)
        self.pid, self.returncode, self.log_path = pid, returncode, log_path


# Listening ports are drawn below Linux's ephemeral range (32768-60999): an OS-chosen port comes from
# that range, where any outgoing connection (the rollout's HTTP clients make many) can take it as its
# source port between our check and the server's bind ("Address already in use" at start-up).
LISTEN_PORTS = (20000, 32000)


# Its own generator: the trainer seeds the global one (cpu_compat.seed_all), so every process would draw alike.
_PORT_DRAW = random.Random()
# Ports handed out lately by this process: two draws before either is bound (a router's port and its metrics port,
# an engine's port and its NCCL port) must not coincide (CI once started a router whose two ports were one).
_HANDED_OUT: deque[int] = deque(maxlen=512)
# Held while this process probes a port (free_port, check_port_free) and while it forks (`forking`): a child forked
# during a probe holds a copy of the probe's bound socket until it execs, so the port the probe found free looked taken
# at the caller's check a moment later (bench_starts.py: "already in use ... no socket holds it now" in 4 of 116 engine
# starts; one thread drawing and checking beside one starting processes: 78 of 416k checks failed, 0 with this lock).
_PORT_LOCK = threading.Lock()


def free_port(host: str = "127.0.0.1", low: int | None = None, high: int | None = None) -> int:
    """A port free on `host` right now, drawn from [low, high) (default LISTEN_PORTS); another process may
    still take it before it is bound, but not as an outgoing connection's source port."""
    low, high = (low, high) if low is not None and high is not None else LISTEN_PORTS
    # One draw at a time: another thread's probe bind must not hold a port this one just handed out while the caller
    # checks it (bench_starts.py saw "already in use ... no socket holds it now" three times in 132 engine starts).
    with _PORT_LOCK:
        for port in _PORT_DRAW.sample(range(low, high), min(200, high - low)):
            if port in _HANDED_OUT:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
            _HANDED_OUT.append(port)
            return port
    raise PortInUseError(f"no free port found on {host} in [{low}, {high}) after 200 tries")


def check_port_free(host: str, port: int) -> None:
    """Raise PortInUseError, naming the port, what holds it and what to do, if `host:port` cannot be bound."""
    with _PORT_LOCK, socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # SO_REUSEADDR as servers set it: a port in TIME_WAIT after a stopped server is usable, a listener is not.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise PortInUseError(
                f"port {port} on {host} is already in use ({exc.strerror}; {port_holders(port)}); stop the process "
                f"holding it (`ss -tanp 'sport = :{port}'` shows it) or choose another port (leave the port unset to "
                "pick a free one)"
            ) from exc


def port_holders(port: int) -> str:
    """The sockets on local `port` as `ss` would list them (state, pid, command), for an error message."""
    try:
        held = [c for c in psutil.net_connections(kind="tcp") if c.laddr and c.laddr.port == port]
    except (psutil.AccessDenied, OSError) as exc:
        return f"its holder is unknown: {exc}"
    if not held:
        return "no socket holds it now"
    parts = []
    for conn in held[:3]:
        who = f"pid {conn.pid}" if conn.pid else "no pid (another user's process)"
        with contextlib.suppress(psutil.Error):
            if conn.pid:
                command = " ".join(" ".join(psutil.Process(conn.pid).cmdline()).split())  # one line: `python -c`
                who += f" ({command[:120]})"
        parts.append(f"{conn.status} {conn.laddr.ip}:{port} by {who}")
    return "held: " + "; ".join(parts)


def die_with_parent(parent_pid: int) -> Callable[[], None]:
    """A preexec_fn that makes the kernel SIGKILL the child when the parent dies."""

    libc = ctypes.CDLL("libc.so.6", use_errno=True)  # loaded before fork: the child only calls into it

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        # The parent may have died between fork and prctl: then nobody would ever signal us.
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


def group_has_live_members(pgid: int) -> bool:
    """Whether any non-zombie process is in group `pgid` (reparented orphans stay zombies until init reaps them)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


@contextlib.contextmanager
def forking() -> Iterator[None]:
    """Hold while forking a child (subprocess.Popen returns once it has exec'd): no port probe of this process is
    open then, so no child inherits one."""
    with _PORT_LOCK:
        yield


def _spawner_loop() -> None:
    """Run queued fork calls forever on one thread."""
    while True:
        fn, future = _SPAWN_QUEUE.get()
        try:
            future.set_result(fn())
        except BaseException as exc:  # handed to the caller
            future.set_exception(exc)


def _on_spawner_thread(fn: Callable[[], Any]) -> Any:
    """Call `fn` on the one long-lived daemon thread that forks every child.

    PDEATHSIG fires when the *thread* that forked the child exits, not the process: a child forked from a
    ThreadPoolExecutor worker would be killed when the pool shuts down. A daemon thread lives until the process ends.
    """
    global _SPAWNER
    with _LIVE_LOCK:
        if _SPAWNER is None or not _SPAWNER.is_alive():
            _SPAWNER = threading.Thread(target=_spawner_loop, name="slime_like-spawner", daemon=True)
            _SPAWNER.start()
    future: Future[Any] = Future()
    _SPAWN_QUEUE.put((fn, future))
    return future.result()


class ManagedProcess:
    """A command in its own process session, logged to a file, stopped with its whole process group."""

    def __init__(
        self,
        cmd: Sequence[str],
        log_path: str | Path,
        env: Mapping[str, str] | None = None,
        name: str | None = None,
        cwd: str | Path | None = None,
    ) -> None:
        self.cmd = [str(c) for c in cmd]
        self.log_path = Path(log_path)
        self.env = dict(env or {})
        self.name = name or Path(self.cmd[0]).name
        self.cwd = cwd
        self._popen: subprocess.Popen[bytes] | None = None

    def start(self) -> ManagedProcess:
        """Launch the command; stdout and stderr go to `log_path`."""
        if self._popen is not None:
            raise RuntimeError(f"{self.name} was already started (pid {self._popen.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Unbuffered output so the log tail shown in errors is current.
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        with open(self.log_path, "ab") as log:
            log.write(f"$ {shlex.join(self.cmd)}\n".encode())
            log.flush()
            popen = functools.partial(
                subprocess.Popen,
                self.cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.cwd,
                start_new_session=True,
                preexec_fn=die_with_parent(os.getpid()),
            )
            with forking():
                self._popen = _on_spawner_thread(popen)
        with _LIVE_LOCK:
            _LIVE.add(self)
        return self

    @property
    def pid(self) -> int | None:
        """The leader's pid (also the process group and session id), or None before start."""
        return self._popen.pid if self._popen else None

    @property
    def returncode(self) -> int | None:
        """The exit status if the process has exited (negative: killed by that signal), else None."""
        return self._popen.poll() if self._popen else None

    def is_running(self) -> bool:
        """Whether the leader process was started and has not exited."""
        return self._popen is not None and self._popen.poll() is None

    def tail_log(self, n_lines: int = 40) -> str:
        """The last `n_lines` lines of the log file, colour codes removed ('' if there is none yet)."""
        try:
            with open(self.log_path, errors="replace") as f:
                # The router's Rust logger colours its output even into a file (NO_COLOR is ignored).
                return _ANSI_ESCAPE.sub("", "".join(deque(f, maxlen=n_lines)))
        except FileNotFoundError:
            return ""

    def check_alive(self, doing: str) -> None:
        """Raise ProcessStartError, with the exit code and log tail, if the process has exited."""
        rc = self.returncode
        if rc is not None:
            raise ProcessStartError(
                self._report(f"{self.name} exited with code {rc} while {doing}"), self.pid, rc, self.log_path
            )

    def wait_http_ok(
        self,
        url: str,
        timeout: float,
        interval: float = 0.5,
        request_timeout: float = 5.0,
        what: str = "ready",
        check: Callable[[requests.Response], bool] | None = None,
    ) -> None:
        """Poll GET `url` until it answers 200 (and `check` passes); raise ProcessStartError on exit or timeout."""
        start = time.monotonic()
        deadline = start + timeout
        while True:
            rc = self.returncode
            if rc is not None:
                headline = f"{self.name} exited with code {rc} before {url} answered 200 ({what})"
                raise ProcessStartError(self._report(headline, start), self.pid, rc, self.log_path)
            try:
                # Never let one slow request push the wait far past `timeout`.
                resp = requests.get(url, timeout=min(request_timeout, max(0.5, deadline - time.monotonic())))
                if resp.status_code == 200 and (check is None or check(resp)):
                    return
            except requests.RequestException:
                pass  # not listening yet
            if time.monotonic() > deadline:
                headline = f"{self.name} did not become {what}: {url} gave no 200 within {timeout:.0f}s"
                raise ProcessStartError(self._report(headline, start), self.pid, None, self.log_path)
            time.sleep(interval)

    def _report(self, headline: str, start: float | None = None) -> str:
        """An error message: what happened, after how long, the command, the log path and its last 40 lines."""
        elapsed = f" (after {time.monotonic() - start:.1f}s)" if start is not None else ""
        return (
            f"{headline}{elapsed}.\ncommand: {shlex.join(self.cmd)}\nlog: {self.log_path}\n"
            f"--- last 40 lines of the log ---\n{self.tail_log(40)}"
        )

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM the leader, SIGKILL its whole process group after `timeout` s (or once it exits); return its status."""
        self._terminate()
        return self._kill_after(time.monotonic() + timeout)

    def _terminate(self) -> None:
        """Ask the leader to shut down.

        Only the leader: it tears down its own children (SGLang does), whereas SIGTERM to the whole group
        makes SGLang's scheduler die first and its leader take a slow crash path (5 s diagnostics sleep).
        """
        if self.is_running():
            try:
                os.kill(self._popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def _kill_after(self, deadline: float) -> int | None:
        """Wait for the leader until `deadline`, then SIGKILL everything left in its process group."""
        if self._popen is None:
            return None
        try:
            self._popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        # Always sweep the group: children that outlived the leader (or ignored SIGTERM) would be orphans.
        try:
            os.killpg(self._popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        rc = self._popen.wait()
        # SIGKILL is asynchronous: return once the group is empty (bounded), so its ports and memory are free.
        gone_by = time.monotonic() + 2.0
        while group_has_live_members(self._popen.pid) and time.monotonic() < gone_by:
            time.sleep(0.02)
        with _LIVE_LOCK:
            _LIVE.discard(self)
        return rc

    def __enter__(self) -> ManagedProcess:
        return self if self._popen else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ManagedProcess({self.name!r}, pid={self.pid}, returncode={self.returncode})"


def stop_all(timeout: float = 10.0) -> None:
    """Stop every process started here that is still registered: SIGTERM all, then SIGKILL after `timeout`."""
    with _LIVE_LOCK:
        procs = list(_LIVE)
    for proc in procs:
        proc._terminate()
    deadline = time.monotonic() + timeout
    for proc in procs:
        proc._kill_after(deadline)


# Nothing started here outlives a normal interpreter exit; PDEATHSIG covers a killed interpreter.
atexit.register(stop_all)
