"""Sandboxes for agents, as slime's `slime.agent.sandbox` (which re-exports this module): the small `Sandbox`
protocol (async context, `exec`, `write_file`, `read_file`), `exec_and_wait`, `ensure_agent_user`, and
`E2BSandbox`, with a local backend in place of E2B's cloud.

`E2BSandbox(image)` is E2B's (the `e2b` package and a gateway: `SLIME_AGENT_SANDBOX_IMAGE_METADATA_KEY`,
`E2B_API_KEY`) when `SLIME_AGENT_SANDBOX` is unset or `e2b`; with `SLIME_AGENT_SANDBOX=local` it is a `LocalSandbox`
(plugins/local_sandbox.py: bubblewrap on this machine), where `image` names a host directory copied per sandbox,
`"/host/repo"` (bound at /testbed, SWE-bench's workdir) or `"/host/repo:/sandbox/workdir"`. The local sandbox has no
network but its loopback, where the ports of the adapters served with `run_app_in_thread` (and those in
`SLIME_AGENT_SANDBOX_BRIDGE`, comma-separated) reach this host's: an agent uses the same URL as outside, with
`ADAPTER_PUBLIC_HOST=127.0.0.1`. The coding-agent CLIs of scripts/setup-coding-agents.sh (.agents-npm/, or
`SLIME_AGENT_CLI_PREFIX`) are on its PATH, read-only. Its limits: `SLIME_AGENT_SANDBOX_MEMORY_MB` (4096),
`SLIME_AGENT_SANDBOX_CPUS` (1), `SLIME_AGENT_SANDBOX_LIFETIME_SEC` (3600).

A local sandbox has one unprivileged user (`agent`, home /home/agent): `user="root"` runs as it too, and
`ensure_agent_user` only checks it exists.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from plugins.local_sandbox import Limits, LocalSandbox, SandboxError

ExecResult = tuple[int, str, str]
FileContent = str | bytes | Path
EXIT_TIME_BUDGET_EXCEEDED = -1
BACKEND_ENV = "SLIME_AGENT_SANDBOX"
LOCAL_WORKDIR = "/testbed"
CLI_MOUNT = "/opt/slime-agents"  # the CLIs' npm prefix, in a local sandbox
_REPO_ROOT = Path(__file__).resolve().parents[1]
_BRIDGE_PORTS: set[int] = set()  # this host's loopback ports a local sandbox reaches (the adapters')


@runtime_checkable
class Sandbox(Protocol):
    """What agent rollouts need of a sandbox."""

    sandbox_id: str

    async def __aenter__(self) -> Sandbox: ...

    async def __aexit__(self, exc_type, exc, tb) -> None: ...

    async def exec(
        self,
        cmd: str,
        *,
        user: str = "root",
        env: dict[str, str] | None = None,
        timeout: int = 120,
        check: bool = False,
        idempotent: bool = True,
    ) -> ExecResult: ...

    async def write_file(self, sandbox_path: str, content: FileContent, *, user: str = "root") -> None: ...

    async def read_file(self, sandbox_path: str, *, user: str = "root") -> str: ...


def allow_port(port: int) -> None:
    """Let local sandboxes made from now on reach this host's 127.0.0.1:`port` (an adapter's)."""
    _BRIDGE_PORTS.add(int(port))


def bridge_ports() -> list[int]:
    """The ports a local sandbox bridges: the adapters' and SLIME_AGENT_SANDBOX_BRIDGE's."""
    extra = {int(p) for p in os.environ.get("SLIME_AGENT_SANDBOX_BRIDGE", "").split(",") if p.strip()}
    return sorted(_BRIDGE_PORTS | extra)


def cli_prefix() -> Path:
    """Where scripts/setup-coding-agents.sh installed the CLIs (SLIME_AGENT_CLI_PREFIX to change it)."""
    return Path(os.environ.get("SLIME_AGENT_CLI_PREFIX") or _REPO_ROOT / ".agents-npm")


def local_sandbox(
    repo: str | Path, workdir: str = LOCAL_WORKDIR, *, lifetime_s: float | None = None, bridge: list[int] | None = None
) -> LocalSandbox:
    """A LocalSandbox of a copy of `repo` at `workdir`, the CLIs on its PATH, `bridge` (default: the adapters'
    ports) bridged."""
    binds, env = {}, {}
    prefix = cli_prefix()
    if prefix.is_dir():
        binds[CLI_MOUNT] = str(prefix)
        env["PATH"] = f"{CLI_MOUNT}/node_modules/.bin:/usr/local/bin:/usr/bin:/bin"
    limits = Limits(
        memory_mb=int(os.environ.get("SLIME_AGENT_SANDBOX_MEMORY_MB", "4096")),
        cpus=float(os.environ.get("SLIME_AGENT_SANDBOX_CPUS", "1")),
        lifetime_s=lifetime_s or float(os.environ.get("SLIME_AGENT_SANDBOX_LIFETIME_SEC", "3600")),
    )
    return LocalSandbox(
        repo, workdir=workdir, binds=binds, bridge=bridge_ports() if bridge is None else bridge, limits=limits, env=env
    )


def is_local(sb: Any) -> bool:
    """True for a sandbox with one user (the local backend)."""
    return bool(getattr(sb, "single_user", False))


async def exec_and_wait(
    sb: Sandbox,
    *,
    cmd: str,
    time_budget_sec: int,
    tag: str,
    user: str = "root",
    env: dict[str, str] | None = None,
    workdir: str | None = None,
    out_file: str | None = None,
    want_output: bool = False,
) -> tuple[int, str]:
    """Run `cmd` to completion: (exit code, its output when `want_output`, else the tail of a failure's);
    EXIT_TIME_BUDGET_EXCEEDED past `time_budget_sec`. As slime, detached with an exit-code marker polled by short
    calls (a remote sandbox's long call may be cut); a local sandbox runs it as one call."""
    out_file = out_file or f"/tmp/.{tag}.out"
    prefix = f"cd {workdir}\nexport HOME=/home/{user}\n" if workdir else ""
    if is_local(sb):
        prefix = f"cd {workdir}\n" if workdir else ""
        await sb.write_file(f"/tmp/.{tag}.sh", f"#!/bin/bash\n{prefix}{cmd}\n")
        rc, _, _ = await sb.exec(f"bash /tmp/.{tag}.sh < /dev/null > {out_file} 2>&1", env=env, timeout=time_budget_sec)
        rc = EXIT_TIME_BUDGET_EXCEEDED if rc == 124 else rc
    else:
        done = f"/tmp/.{tag}.done"
        await sb.write_file(f"/tmp/.{tag}.sh", f"#!/bin/bash\n{prefix}{cmd}\necho $? > {done}\n", user=user)
        await sb.exec(f"rm -rf /tmp/.{tag}.spawned; rm -f {out_file} {done}", user=user, timeout=30, check=True)
        spawn = f"mkdir /tmp/.{tag}.spawned 2>/dev/null || exit 0; setsid bash /tmp/.{tag}.sh < /dev/null > {out_file} 2>&1 &"  # noqa: E501
        await sb.exec(spawn, user=user, env=env, timeout=30, check=True)
        rc = await _await_marker(sb, done, user=user, budget=time_budget_sec)
    if want_output:
        return rc, await sb.read_file(out_file, user=user)
    if rc == 0:
        return rc, ""
    _, tail, _ = await sb.exec(f"tail -c 512 {out_file} 2>/dev/null", user=user, timeout=15)
    return rc, tail or ""


async def _await_marker(sb: Sandbox, done: str, *, user: str, budget: float) -> int:
    deadline = time.monotonic() + budget
    while time.monotonic() < deadline:
        await asyncio.sleep(5)
        rc, out, _ = await sb.exec(f"test -f {done} && cat {done}", user=user, timeout=15)
        if rc == 0 and out.strip():
            return int(out.strip())
    return EXIT_TIME_BUDGET_EXCEEDED


async def ensure_agent_user(sb: Sandbox, workdir: str) -> None:
    """The unprivileged `agent` user owning `workdir` (made in an E2B sandbox; a local one has it already)."""
    if is_local(sb):
        await sb.exec("id agent", check=True, timeout=30)
        return
    await sb.exec(
        f"id agent >/dev/null 2>&1 || useradd -m -s /bin/bash agent && chown -R agent:agent /home/agent {workdir} "
        "&& git config --system --add safe.directory '*' && id agent",
        user="root",
        check=True,
        timeout=60,
    )


class E2BSandbox:
    """slime's E2B sandbox; a LocalSandbox when SLIME_AGENT_SANDBOX=local (see the module's docstring)."""

    def __new__(cls, image: str, **kwargs: Any) -> Any:
        backend = os.environ.get(BACKEND_ENV, "e2b").strip() or "e2b"
        if backend == "local":
            repo, _, workdir = image.partition(":")
            lifetime = kwargs.get("timeout")
            return local_sandbox(repo, workdir or LOCAL_WORKDIR, lifetime_s=float(lifetime) if lifetime else None)
        if backend != "e2b":
            raise ValueError(f"{BACKEND_ENV}={backend!r}: expected 'e2b' or 'local'")
        return super().__new__(cls)

    def __init__(self, image: str, *, timeout: int | None = None, **kwargs: Any) -> None:
        self.image, self.timeout, self.options = image, timeout, kwargs
        self.sandbox_id = ""

    async def __aenter__(self) -> Any:
        try:
            import e2b  # type: ignore  # noqa: F401
        except ImportError:
            raise SandboxError(
                "E2BSandbox needs the `e2b` package (pip install e2b) and an E2B gateway (E2B_API_KEY, "
                "SLIME_AGENT_SANDBOX_IMAGE_METADATA_KEY); it is not installed here. For a sandbox on this machine set "
                f"{BACKEND_ENV}=local (plugins/local_sandbox.py; scripts/setup-coding-agents.sh installs bubblewrap)"
            ) from None
        raise SandboxError(
            "slime_like's E2BSandbox does not drive E2B's cloud: install the real slime next to e2b, or set "
            f"{BACKEND_ENV}=local for a sandbox on this machine"
        )

    async def __aexit__(self, exc_type, exc, tb) -> None:
        pass


__all__ = [
    "EXIT_TIME_BUDGET_EXCEEDED",
    "E2BSandbox",
    "ExecResult",
    "FileContent",
    "LocalSandbox",
    "Sandbox",
    "SandboxError",
    "allow_port",
    "ensure_agent_user",
    "exec_and_wait",
]
