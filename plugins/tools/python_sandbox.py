"""A sandboxed Python tool: a fresh interpreter with CPU-time, memory, file-size and wall-clock limits, no network.

Network isolation comes from a new, empty network namespace (`unshare -rn`) where the kernel allows
unprivileged user namespaces; elsewhere only the in-process guard below applies (sockets refused in the
`socket` module), which a determined program can get around. Run untrusted code in a container as well.
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

# Runs in the sandboxed interpreter: set the limits, refuse sockets, then run the code file.
_BOOTSTRAP = """
import resource, socket, sys
path, mem, cpu = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
def _refused(*args, **kwargs):
    raise PermissionError("network access is disabled in the sandbox")
for name in ("connect", "connect_ex", "bind", "sendto"):
    setattr(socket.socket, name, _refused)
socket.create_connection = socket.getaddrinfo = _refused
sys.argv = [path]
code = open(path).read()
exec(compile(code, "<sandbox>", "exec"), {"__name__": "__main__"})
"""


class SandboxTimeout(TimeoutError):
    """The code ran past its wall-clock limit and was killed."""


@functools.cache
def network_namespace_prefix() -> tuple[str, ...]:
    """`unshare -rn` when this kernel lets an unprivileged process make an empty network namespace, else ()."""
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-rn", "true"], capture_output=True).returncode == 0:
        return (unshare, "-rn")
    logger.warning("unshare -rn is not available: the Python sandbox only refuses sockets in-process")
    return ()


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
    with tempfile.TemporaryDirectory(prefix="sandbox_") as workdir:
        path = os.path.join(workdir, "main.py")
        with open(path, "w") as f:
            f.write(code)
        cmd = [*network_namespace_prefix(), sys.executable, "-I", "-c", _BOOTSTRAP, path]
        cmd += [str(memory_mb * 1024 * 1024), str(max(1, int(timeout) + 1))]
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            cwd=workdir,
            env={"PATH": "/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8"},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            assert proc.stdout is not None
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
