"""A sandbox on this machine for coding agents: slime's `Sandbox` protocol (async context, `exec`, `write_file`,
`read_file`) with bubblewrap in place of E2B's cloud.

    async with LocalSandbox("/data/tasks/repo-17", workdir="/workspace/repo", bridge=[endpoint_port]) as sb:
        rc, out, err = await sb.exec("python -m unittest", timeout=60)

Each sandbox is
- a per-sample copy of a repository (`repo`, copied to a fresh directory and bound read-write at `workdir`), its own
  home (/home/agent) and /tmp, the system's /usr and /etc read-only (with a passwd naming its one user, `agent`,
  uid 1000), and `binds` (sandbox path -> host path, read-only: e.g. the coding-agent CLIs); nothing else of the host;
  `env` adds to the environment its commands start from (PATH, HOME=/home/agent, ...);
- in new user, PID, network, IPC, UTS and cgroup namespaces (bwrap --unshare-all), run on the host as a user id of
  its own (so the kernel counts its processes apart from every other sandbox's, and it can read only what anyone may);
- without a network: its namespace has nothing but its own loopback. Each port in `bridge` is served inside on
  127.0.0.1:PORT, piped through a unix socket to the host's 127.0.0.1:PORT (the run's endpoint): the same URL works
  inside and out, and no other address is reachable;
- limited: memory, CPU share and process count in cgroups when this machine lets us make them (else RLIMIT_DATA for
  memory), the number of processes of its user (RLIMIT_NPROC), file size (RLIMIT_FSIZE), and a lifetime after which it
  is killed; each `exec` has its own timeout (its process group is killed then: rc 124);
- gone at the end: leaving the context (or its lifetime, or this process exiting: --die-with-parent) kills its PID
  namespace, hence everything it started, then every process left of its host user id and of its cgroups; its copy is
  deleted (`keep=True` keeps it).

One user: `exec(user=...)` accepts slime's "root" and "agent" and runs both as the sandbox's user (no root inside).
Needs bubblewrap (`apt-get install bubblewrap`; scripts/setup-coding-agents.sh installs it) and root on the host (to
run each sandbox as a user id of its own); `LocalSandbox.check()` says what is missing.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from plugins.sandbox_init import pipe  # the same copy loop serves both ends of a bridged connection

logger = logging.getLogger(__name__)

INIT_SCRIPT = Path(__file__).with_name("sandbox_init.py")
CTL_DIR = "/run/slime"  # in the sandbox: the init script and the bridge sockets (read-only)
HOME = "/home/agent"
SANDBOX_UID = 1000
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PARENT = "slime-sandbox"
TIMEOUT_RC = 124  # an exec killed at its timeout (as coreutils' timeout)
_counter = itertools.count()

ExecResult = tuple[int, str, str]


class SandboxError(RuntimeError):
    """The sandbox cannot start here, died, or a command it was asked to run failed (check=True)."""


@dataclass(frozen=True)
class Limits:
    """What one sandbox may use."""

    memory_mb: int = 4096  # all its processes together (cgroup), else each process's data segment
    cpus: float = 1.0  # CPU share (cgroup quota), when cgroups can be made
    max_procs: int = 512  # processes and threads of its user at once
    file_mb: int = 1024  # largest file it may write
    lifetime_s: float = 3600.0  # then it is killed, whatever runs


def check() -> str | None:
    """Why a local sandbox cannot run on this machine, or None."""
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (apt-get install bubblewrap, or bash scripts/setup-coding-agents.sh)"
    if os.geteuid() != 0:
        return "the local sandbox runs each sandbox as a host user id of its own: it needs root (setpriv, cgroups)"
    for tool in ("setpriv", "prlimit"):
        if shutil.which(tool) is None:
            return f"{tool} (util-linux) is not installed"
    return None


def host_uid() -> int:
    """A fresh host user id for one sandbox: owned by no account, not shared with any other sandbox of this process."""
    # 20,000 ids a process (a wrap could meet a sandbox still alive, whose processes its close would kill).
    return 1_500_000_000 + (os.getpid() % 100_000) * 20_000 + next(_counter) % 20_000


def passwd_files(uid: int = SANDBOX_UID) -> tuple[str, str]:
    """/etc/passwd and /etc/group for the sandbox: root, and its one user `agent`."""
    passwd = f"root:x:0:0:root:/root:/bin/bash\nagent:x:{uid}:{uid}:agent:{HOME}:/bin/bash\n"
    passwd += "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    group = f"root:x:0:\nagent:x:{uid}:\nnogroup:x:65534:\n"
    return passwd, group


def bwrap_argv(
    root: Path, workdir: str, binds: Mapping[str, str], ports: Sequence[int], env: Mapping[str, str]
) -> list[str]:
    """bwrap's command line for a sandbox whose host files are under `root` (work/, home/, tmp/, etc/, ctl/)."""
    argv = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    argv += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
    argv += ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib64", "lib32", "libx32"):
        host = Path("/") / name
        if host.is_symlink():
            argv += ["--symlink", os.readlink(host), f"/{name}"]
        elif host.is_dir():
            argv += ["--ro-bind", str(host), f"/{name}"]
    argv += ["--ro-bind", "/etc", "/etc"]
    argv += ["--ro-bind", str(root / "etc/passwd"), "/etc/passwd", "--ro-bind", str(root / "etc/group"), "/etc/group"]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/run", "--dir", "/var", "--dir", "/var/tmp"]
    argv += ["--bind", str(root / "tmp"), "/tmp", "--bind", str(root / "home"), HOME]
    argv += ["--bind", str(root / "work"), workdir, "--ro-bind", str(root / "ctl"), CTL_DIR]
    for inside, host in binds.items():
        argv += ["--ro-bind", str(host), inside]
    argv += ["--chdir", workdir, "--clearenv"]
    for key, value in env.items():
        argv += ["--setenv", key, value]
    argv += ["/usr/bin/python3", "-I", "-S", f"{CTL_DIR}/init.py", *map(str, ports)]
    return argv


def base_env(workdir: str) -> dict[str, str]:
    """The environment every command in the sandbox starts from."""
    return {"PATH": PATH, "HOME": HOME, "USER": "agent", "LOGNAME": "agent", "SHELL": "/bin/bash", "LANG": "C.UTF-8",
            "TMPDIR": "/tmp", "SANDBOX_WORKDIR": workdir, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}  # fmt: skip


class _Cgroups:
    """cgroup v1 (memory, cpu, pids) or v2 groups of one sandbox, where this machine lets us make them."""

    def __init__(self, name: str, limits: Limits) -> None:
        self.dirs: list[Path] = []
        v2 = (CGROUP_ROOT / "cgroup.controllers").exists()
        settings = {
            "memory": {"memory.limit_in_bytes": limits.memory_mb << 20} if not v2 else {"memory.max": limits.memory_mb << 20},
            "cpu": {"cpu.cfs_period_us": 100_000, "cpu.cfs_quota_us": int(limits.cpus * 100_000)}
            if not v2 else {"cpu.max": f"{int(limits.cpus * 100_000)} 100000"},
            "pids": {"pids.max": limits.max_procs},
        }  # fmt: skip
        self.limited: set[str] = set()
        for controller, values in settings.items():
            base = CGROUP_ROOT if v2 else CGROUP_ROOT / controller
            path = base / CGROUP_PARENT / name
            try:
                path.mkdir(parents=True, exist_ok=True)
                if v2:  # a v2 parent hands its controllers down only when asked
                    (base / CGROUP_PARENT / "cgroup.subtree_control").write_text(f"+{controller}")
                for key, value in values.items():
                    (path / key).write_text(str(value))
            except OSError as exc:
                logger.debug("no %s cgroup for the sandbox: %s", controller, exc)
                continue
            if path not in self.dirs:
                self.dirs.append(path)
            self.limited.add(controller)

    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.dirs:
            try:
                found |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
            except OSError:
                pass
        return found

    def remove(self) -> None:
        for d in self.dirs:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)  # the last killed processes are still leaving


def pids_of_uid(uid: int) -> set[int]:
    """Live processes (not zombies) whose real user id on this host is `uid`."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as f:
                    fields = dict(line.split(":", 1) for line in f if line[:4] in ("Stat", "Uid:"))
            except (OSError, ValueError):
                continue
            if int(fields.get("Uid", "-1").split()[0]) == uid and not fields.get("State", "").strip().startswith("Z"):
                found.add(int(entry))
    return found


def _chown_tree(path: Path, uid: int) -> None:
    os.lchown(path, uid, uid)
    for parent, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(parent, name), uid, uid)


class LocalSandbox:
    """slime's Sandbox protocol on this machine (see the module's docstring)."""

    single_user = True  # `user=` is accepted and ignored: one unprivileged user runs everything

    def __init__(
        self,
        repo: str | Path | None = None,
        *,
        workdir: str = "/workspace",
        binds: Mapping[str, str | Path] | None = None,
        bridge: Sequence[int] = (),
        limits: Limits | None = None,
        env: Mapping[str, str] | None = None,
        base_dir: str | Path | None = None,
        keep: bool = False,
    ) -> None:
        self.repo = Path(repo) if repo is not None else None
        self.workdir = workdir
        self.binds = {k: str(v) for k, v in (binds or {}).items()}
        self.bridge = list(bridge)
        self.limits = limits or Limits()
        self.env = {**base_env(workdir), **(env or {})}  # what every command starts from
        self.base_dir = Path(base_dir or os.environ.get("SLIME_AGENT_SANDBOX_DIR") or Path(tempfile.gettempdir()) / "slime-sandboxes")  # fmt: skip
        self.keep = keep
        self.sandbox_id = ""
        self.uid = 0
        self.root: Path | None = None
        self.limited: set[str] = set()  # what the kernel enforces: memory, cpu, pids (cgroups), nproc, fsize, data
        self._proc: asyncio.subprocess.Process | None = None
        self._cgroups: _Cgroups | None = None
        self._servers: list[asyncio.AbstractServer] = []
        self._pending: dict[int, asyncio.Future[dict]] = {}
        self._ids = itertools.count(1)
        self._reader: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    # --- life -------------------------------------------------------------------------------------------------

    async def __aenter__(self) -> LocalSandbox:
        why = check()
        if why:
            raise SandboxError(f"the local sandbox cannot run here: {why}")
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        await self.close()

    async def _start(self) -> None:
        self.uid = host_uid()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.base_dir, 0o711)
        self.root = Path(tempfile.mkdtemp(prefix="sb-", dir=self.base_dir))
        self.sandbox_id = self.root.name
        await asyncio.to_thread(self._make_files)
        self._cgroups = _Cgroups(self.sandbox_id, self.limits)
        self.limited = set(self._cgroups.limited) | {"nproc", "fsize"}
        for port in self.bridge:
            self._servers.append(await asyncio.start_unix_server(_forward_to(port), path=str(self.root / f"ctl/port-{port}.sock")))  # fmt: skip
            os.chmod(self.root / f"ctl/port-{port}.sock", 0o666)
        rlimits = [f"--nproc={self.limits.max_procs}", f"--fsize={self.limits.file_mb << 20}", "--core=0"]
        if "memory" not in self.limited:
            rlimits.append(f"--data={self.limits.memory_mb << 20}")
            self.limited.add("data")
        join = 'for f; do [ "$f" = -- ] && break; echo $$ > "$f"; shift; done; shift; exec "$@"'
        argv = ["/bin/sh", "-c", join, "sh", *self._cgroups.procs_files(), "--", "prlimit", *rlimits, "--"]
        argv += ["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups", "--"]
        argv += bwrap_argv(self.root, self.workdir, self.binds, self.bridge, self.env)
        self._proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={"PATH": PATH}, start_new_session=True, limit=1 << 30,
        )  # fmt: skip
        assert self._proc.stdout is not None
        try:
            ready = await asyncio.wait_for(self._proc.stdout.readline(), 30)
        except TimeoutError:
            ready = b""
        if not ready.strip():
            err = (await asyncio.wait_for(self._proc.stderr.read(4096), 5)).decode(errors="replace") if self._proc.stderr else ""  # type: ignore[union-attr]  # fmt: skip
            raise SandboxError(f"the sandbox did not start (bwrap: {err.strip() or 'no output'})")
        self._reader = asyncio.ensure_future(self._read_answers())
        self._watchdog = asyncio.ensure_future(self._expire())

    def _make_files(self) -> None:
        assert self.root is not None
        for sub in ("work", "home", "tmp", "etc", "ctl"):
            (self.root / sub).mkdir()
        if self.repo is not None:
            if not self.repo.is_dir():
                raise SandboxError(f"the sandbox's repository {self.repo} is not a directory")
            shutil.copytree(self.repo, self.root / "work", symlinks=True, dirs_exist_ok=True)
        passwd, group = passwd_files()
        (self.root / "etc/passwd").write_text(passwd)
        (self.root / "etc/group").write_text(group)
        shutil.copyfile(INIT_SCRIPT, self.root / "ctl/init.py")
        for sub in ("ctl", "etc"):
            os.chmod(self.root / sub, 0o755)
            for f in (self.root / sub).iterdir():
                os.chmod(f, 0o644)
        for sub in ("work", "home", "tmp"):
            _chown_tree(self.root / sub, self.uid)
        os.chmod(self.root / "tmp", 0o1777)
        os.chmod(self.root, 0o755)

    async def _expire(self) -> None:
        await asyncio.sleep(self.limits.lifetime_s)
        logger.warning("sandbox %s: its lifetime (%gs) is over: killed", self.sandbox_id, self.limits.lifetime_s)
        self._kill()

    def _kill(self) -> None:
        """Kill the sandbox's PID namespace, then whatever is left of its host user and cgroups."""
        if self._proc is not None and self._proc.returncode is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for _ in range(3):
            left = (pids_of_uid(self.uid) if self.uid else set()) | (self._cgroups.pids() if self._cgroups else set())
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)

    def leftover_pids(self) -> set[int]:
        """Processes of the sandbox still alive (none once it is closed)."""
        return (pids_of_uid(self.uid) if self.uid else set()) | (self._cgroups.pids() if self._cgroups else set())

    async def close(self) -> None:
        """Kill everything it started and delete its files (idempotent)."""
        for task in (self._watchdog, self._reader):
            if task is not None:
                task.cancel()
        await asyncio.to_thread(self._kill)
        if self._proc is not None and self._proc.returncode is None:
            try:
                await asyncio.wait_for(self._proc.wait(), 5)
            except TimeoutError:
                pass
        for server in self._servers:
            server.close()
        self._servers.clear()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(SandboxError(f"sandbox {self.sandbox_id} is closed"))
        self._pending.clear()
        if self._cgroups is not None:
            await asyncio.to_thread(self._cgroups.remove)
        if self.root is not None and not self.keep:
            await asyncio.to_thread(shutil.rmtree, self.root, True)

    # --- the protocol -----------------------------------------------------------------------------------------

    async def _read_answers(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        while line := await self._proc.stdout.readline():
            answer = json.loads(line)
            fut = self._pending.pop(answer.pop("id", None), None)
            if fut is not None and not fut.done():
                fut.set_result(answer)
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(SandboxError(f"sandbox {self.sandbox_id} died (its lifetime is over, or it was killed)"))  # fmt: skip

    async def _ask(self, request: dict, timeout: float) -> dict:
        if self._proc is None or self._proc.returncode is not None or self._reader is None or self._reader.done():
            raise SandboxError(f"sandbox {self.sandbox_id or '(not started)'} is not running")
        rid = next(self._ids)
        fut: asyncio.Future[dict] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        assert self._proc.stdin is not None
        async with self._lock:
            self._proc.stdin.write((json.dumps({"id": rid, **request}) + "\n").encode())
            await self._proc.stdin.drain()
        answer = await asyncio.wait_for(fut, timeout)
        if answer.get("error"):
            raise SandboxError(f"sandbox {self.sandbox_id}: {answer['error']}")
        return answer

    async def exec(
        self,
        cmd: str,
        *,
        user: str = "root",
        env: dict[str, str] | None = None,
        timeout: int = 120,
        check: bool = False,
        idempotent: bool = True,
        cwd: str | None = None,
    ) -> ExecResult:
        """Run `cmd` with bash in the sandbox: (exit code, stdout, stderr); 124 when killed at `timeout`."""
        request = {"op": "exec", "cmd": cmd, "env": env or {}, "cwd": cwd or self.workdir, "timeout": timeout}
        answer = await self._ask(request, timeout + 30)
        rc = TIMEOUT_RC if answer["timed_out"] else answer["rc"]
        stderr = answer["stderr"] + (f"\n[killed at its {timeout}s timeout]" if answer["timed_out"] else "")
        if check and rc != 0:
            raise SandboxError(f"sandbox exec failed (exit={rc}): {cmd[:120]}\n{stderr[-400:]}")
        return rc, answer["stdout"], stderr

    async def write_file(self, sandbox_path: str, content: str | bytes | Path, *, user: str = "root") -> None:
        """Write `content` (text, bytes, or a host file's bytes) at `sandbox_path`, making its directories."""
        if isinstance(content, Path):
            content = await asyncio.to_thread(content.read_bytes)
        data = content.encode() if isinstance(content, str) else content
        await self._ask({"op": "write", "path": sandbox_path, "data": base64.b64encode(data).decode()}, 120)

    async def read_file(self, sandbox_path: str, *, user: str = "root") -> str:
        """The file's text ("" when it cannot be read, as slime's E2B sandbox)."""
        answer = await self._ask({"op": "read", "path": sandbox_path}, 120)
        return "" if answer["data"] is None else base64.b64decode(answer["data"]).decode("utf-8", "replace")


def _forward_to(port: int):
    """A unix-socket handler that pipes each connection to 127.0.0.1:`port` of this host (and nowhere else)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    return handle
