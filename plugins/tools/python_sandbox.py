"""A sandboxed Python tool: a fresh interpreter with wall-clock, CPU-time, memory, process-count and file-size
limits, and no network.

Where the kernel lets an unprivileged process make namespaces (`unshare`), the code also runs in:
- an empty network namespace: no interface but its own loopback, so no server of the run (nor anything else) is
  reachable, with or without the run's secret;
- its own PID namespace: it sees no other process (nor their environments); when the wall clock runs out its
  init is killed and the kernel kills every process left inside, even ones that left the process group;
- its own mount namespace with a fresh, size-capped tmpfs on /tmp and /dev/shm: the run's unix sockets (SGLang's
  ZMQ queues, which unpickle what they receive) and shared-memory tensors there are out of reach.
Without `unshare -rnmpf` it falls back to `unshare -rn` (network only), then to nothing but the limits and an
in-process guard that refuses sockets in the `socket` module, which a determined program can get around.

What it cannot limit: the rest of the filesystem (the code can read and write whatever the user running the
rollout can, e.g. checkpoints and ~/.cache: run untrusted code in a container as well); memory summed over the
processes it forks (RLIMIT_AS is per process; MAX_PROCS bounds how many); RLIMIT_NPROC when the rollout runs as
root outside a user namespace (root is exempt); CPU time of its children is bounded per process, and the whole
tree by the wall clock.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Any

logger = logging.getLogger(__name__)

TIMEOUT_S = 5.0
MEMORY_MB = 256
MAX_OUTPUT_BYTES = 4096
MAX_PROCS = 16  # processes (and threads) the code may have at once: a fork bomb stops here
TMPFS_MB = 64  # the private /tmp (with namespaces)

# Runs in the sandboxed interpreter: read the code from stdin, set the limits, refuse sockets, run the code.
_BOOTSTRAP = """
import os, resource, socket, sys
mem, cpu, nproc = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
code = sys.stdin.read()
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
def _refused(*args, **kwargs):
    raise PermissionError("network access is disabled in the sandbox")
for name in ("connect", "connect_ex", "bind", "sendto"):
    setattr(socket.socket, name, _refused)
socket.create_connection = socket.getaddrinfo = _refused
sys.argv = ["main.py"]
exec(compile(code, "<sandbox>", "exec"), {"__name__": "__main__"})
"""
# Inside the new namespaces: private /tmp and /dev/shm, then the interpreter as the PID namespace's init.
_MOUNTS = (
    f"mount -t tmpfs -o size={TMPFS_MB}m,mode=1777 sandbox /tmp && mount -t tmpfs -o size=1m sandbox /dev/shm "
    '&& cd /tmp && exec "$@"'
)
# The same without the private /tmp, for an interpreter that lives under /tmp (a checkout there would vanish).
_MOUNTS_SHM_ONLY = 'mount -t tmpfs -o size=1m sandbox /dev/shm && exec "$@"'


class SandboxTimeout(TimeoutError):
    """The code ran past its wall-clock limit and was killed."""


@functools.cache
def isolation_prefix() -> tuple[str, ...]:
    """The command prefix that runs the code in its own namespaces: user, network, PID and mount (private /tmp)
    when the kernel allows it, else user and network only, else () (checked once per process)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        logger.warning("unshare is not installed: the Python sandbox only refuses sockets in-process")
        return ()
    works = lambda prefix: subprocess.run([*prefix, sys.executable, "-I", "-c", "pass"], capture_output=True)  # noqa: E731
    full = (unshare, "-rnmpf", "--kill-child", "--mount-proc", "sh", "-c", _MOUNTS, "sh")
    if works(full).returncode == 0:
        return full
    shm_only = (unshare, "-rnmpf", "--kill-child", "--mount-proc", "sh", "-c", _MOUNTS_SHM_ONLY, "sh")
    if works(shm_only).returncode == 0:
        logger.warning("the Python sandbox keeps the host's /tmp: this interpreter (%s) lives there", sys.executable)
        return shm_only
    logger.warning("unshare -rnmpf is not available: the Python sandbox sees the host's processes and /tmp")
    if works((unshare, "-rn")).returncode == 0:
        return (unshare, "-rn")
    logger.warning("unshare -rn is not available: the Python sandbox only refuses sockets in-process")
    return ()


def network_namespace_prefix() -> tuple[str, ...]:
    """The isolation prefix if it includes an empty network namespace (every prefix does), else ()."""
    return isolation_prefix()


async def _read_limited(stream: asyncio.StreamReader, limit: int) -> bytes:
    data = b""
    while len(data) < limit:
        chunk = await stream.read(limit - len(data))
        if not chunk:
            break
        data += chunk
    return data


async def _drain(stream: asyncio.StreamReader) -> None:
    """Read and drop the rest: a full reader pauses the pipe, and until the pipe sees its end, Python 3.11's
    `Process.wait()` does not return even once the process is dead."""
    while await stream.read(1 << 16):
        pass


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole session: children the code forked too
    except ProcessLookupError:
        pass


async def run_python(
    code: str, timeout: float = TIMEOUT_S, memory_mb: int = MEMORY_MB, max_output: int = MAX_OUTPUT_BYTES
) -> str:
    """Run `code`; returns its exit status and combined output (truncated). SandboxTimeout past `timeout`."""
    prefix = isolation_prefix()
    private_tmp = _MOUNTS in prefix
    with tempfile.TemporaryDirectory(prefix="sandbox_") as workdir:  # its cwd without a private /tmp
        cmd = [*prefix, sys.executable, "-I", "-c", _BOOTSTRAP]
        cmd += [str(memory_mb * 1024 * 1024), str(max(1, int(timeout) + 1)), str(MAX_PROCS)]
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            cwd=workdir,
            # A bare environment: nothing of the run's (its secret, tokens, paths) reaches the code.
            env={"PATH": "/usr/bin:/bin", "HOME": "/tmp" if private_tmp else workdir, "LANG": "C.UTF-8"},
            stdin=asyncio.subprocess.PIPE,  # the code, so that it needs no file on the host
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(code.encode())
                await asyncio.wait_for(proc.stdin.drain(), timeout)
                proc.stdin.close()
            except (BrokenPipeError, ConnectionResetError):
                pass  # it died before reading its code: its output says why
            output = await asyncio.wait_for(_read_limited(proc.stdout, max_output), timeout)
            if len(output) >= max_output:
                _kill_group(proc)  # enough output: a print loop must not run until the deadline
            remaining = max(0.0, deadline - loop.time())
            status = (await asyncio.wait_for(asyncio.gather(proc.wait(), _drain(proc.stdout)), remaining))[0]
        except TimeoutError:
            _kill_group(proc)
            await proc.wait()
            raise SandboxTimeout(f"python code timed out after {timeout:g}s and was killed") from None
        finally:
            if proc.returncode is None:
                _kill_group(proc)
                await proc.wait()
    text = output.decode(errors="replace")
    if len(output) >= max_output:
        text += "\n[output truncated]"
    return f"exit status {status}\n{text}"


async def python(arguments: dict[str, Any]) -> str:
    """Tool entry point: {"code": "print(2 ** 10)"} -> "exit status 0\\n1024\\n"."""
    code = arguments.get("code")
    if not isinstance(code, str):
        raise ValueError('python needs {"code": "<python source>"}')
    return await run_python(code)
