"""Coding-agent CLIs run in a sandbox: slime's harness contract (`BaseHarness`, `HarnessContext`,
`ClaudeCodeHarness`, `CodexHarness`; slime.agent.harness re-exports them), written for this engine.

`BaseHarness.run` = the agent user, the CLI's config (`write_config`), then the CLI run to completion
(`launch_and_wait`), in a sandbox of plugins/agent_sandbox.py. In an E2B sandbox the CLI is installed from host
tarballs (`SLIME_AGENT_NODE_TARBALL` and the CLI's, as slime); in a local sandbox it is already on the PATH,
read-only (scripts/setup-coding-agents.sh), and `install_cli` only checks it runs. Beyond slime,
`HarnessContext.api_key` (default: the session id, the key slime's adapters read) lets a harness talk to this
engine's own endpoint, whose session is in the URL and whose key is the run's secret.

Claude Code: `claude -p` headless, permissions bypassed, `ANTHROPIC_BASE_URL` = the adapter's URL, the key as
`ANTHROPIC_AUTH_TOKEN`, its other traffic (telemetry, error reports, updates) off; knobs as slime's:
`SLIME_AGENT_CC_EXTRA_ARGS` (appended to its command line), `SLIME_AGENT_CC_EXTRA_ENVS` (JSON, merged last).

Codex: `codex exec` with a model provider at `<adapter>/v1`. Unlike slime's, `wire_api = "responses"`: Codex 0.171
refuses `"chat"` ("no longer supported"), and this engine's endpoint serves `/v1/responses`
(`SLIME_AGENT_CODEX_WIRE_API` to change it). It runs with `--dangerously-bypass-approvals-and-sandbox`: its own
sandbox (read-only by default) would keep it from editing the repository, and it runs inside ours. Knobs:
`SLIME_AGENT_CODEX_EXTRA_ARGS`, `SLIME_AGENT_CODEX_EXTRA_ENVS`.
"""

from __future__ import annotations

import asyncio
import json
import lzma
import os
import shlex
import shutil
import tempfile
from abc import ABC, ABCMeta, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plugins import agent_sandbox as _sandbox
from plugins.agent_sandbox import Sandbox, SandboxError, exec_and_wait, is_local

NPM_INSTALL_RETRIES = 3
NPM_INSTALL_BACKOFF_SEC = 2.0
SETUP_SCRIPT = "scripts/setup-coding-agents.sh"
HOME = "/home/agent"


class SingletonABCMeta(ABCMeta):
    """ABCMeta with slime's one instance per class (a harness holds no per-run state)."""

    _instances: dict[type, Any] = {}  # noqa: RUF012

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls not in SingletonABCMeta._instances:
            SingletonABCMeta._instances[cls] = super().__call__(*args, **kwargs)
        return SingletonABCMeta._instances[cls]


@dataclass(frozen=True)
class HarnessContext:
    """What a harness run needs, nothing of the task."""

    workdir: str
    session_id: str
    adapter_url: str
    model_label: str = "slime-actor"
    api_key: str | None = None  # the key the CLI sends; None: the session id (slime's adapters read it)
    extra_args: str = ""  # added to the CLI's command line (after the *_EXTRA_ARGS knob)

    @property
    def token(self) -> str:
        """The key the CLI sends."""
        return self.api_key or self.session_id


class BaseHarness(ABC, metaclass=SingletonABCMeta):
    """A coding-agent CLI's life in a sandbox."""

    name: str = ""

    @abstractmethod
    async def install_cli(self, sb: Sandbox) -> None:
        """Make the CLI runnable in the sandbox."""

    @abstractmethod
    async def write_config(self, sb: Sandbox, ctx: HarnessContext) -> None:
        """Write the CLI's config files into the sandbox."""

    @abstractmethod
    async def launch_and_wait(self, sb: Sandbox, ctx: HarnessContext, prompt: str, time_budget_sec: int) -> int:
        """Run the agent to completion: its exit code (EXIT_TIME_BUDGET_EXCEEDED past the budget)."""

    async def run(
        self,
        sb: Sandbox,
        *,
        workdir: str,
        session_id: str,
        adapter_url: str,
        time_budget_sec: int,
        prompt: str,
        api_key: str | None = None,
        extra_args: str = "",
    ) -> int:
        """Agent user, config, launch: the CLI's exit code. The workspace must be ready before."""
        await _sandbox.ensure_agent_user(sb, workdir)
        ctx = HarnessContext(workdir, session_id, adapter_url, api_key=api_key, extra_args=extra_args)
        await self.write_config(sb, ctx)
        return await self.launch_and_wait(sb, ctx, prompt, time_budget_sec)


async def run_agent(sb: Sandbox, *, workdir: str, start_cmd: str, env: dict[str, str], time_budget_sec: int) -> int:
    """Run `start_cmd` as the agent user in `workdir` to completion; its output goes to <workdir>/.harness/."""
    meta = f"{workdir}/.harness"
    chown = "" if is_local(sb) else f" && chown agent:agent {meta}"
    await sb.exec(f"mkdir -p {meta}{chown}", user="root", check=True, timeout=30)
    rc, _ = await exec_and_wait(
        sb, cmd=start_cmd, user="agent", env=env, workdir=workdir, out_file=f"{meta}/trajectory.jsonl",
        time_budget_sec=time_budget_sec, tag="run",
    )  # fmt: skip
    return rc


async def check_cli(sb: Sandbox, check_cmd: str, package: str) -> None:
    """A local sandbox's CLI is on its PATH: SandboxError naming the setup script when it does not run."""
    rc, out, err = await sb.exec(check_cmd, timeout=60)
    if rc != 0:
        raise SandboxError(
            f"{package} does not run in the local sandbox ({check_cmd!r} exited {rc}: {(err or out).strip()[-300:]}); "
            f"install it with `bash {SETUP_SCRIPT}`"
        )


async def install_npm_cli(sb: Sandbox, *, node_runtime: Path, npm_package: Path, check_cmd: str) -> None:
    """Node 22 then the CLI's npm tarball, installed globally in the sandbox, then `check_cmd` (E2B sandboxes)."""
    await install_node22(sb, node_runtime)
    await sb.write_file("/tmp/harness-cli.tgz", npm_package)
    cmd = f"npm install -g --prefix=/usr/local --no-audit --no-fund /tmp/harness-cli.tgz && {check_cmd}"
    rc, log = 1, ""
    for attempt in range(NPM_INSTALL_RETRIES):
        rc, log = await exec_and_wait(sb, cmd=cmd, user="root", time_budget_sec=300, tag="harness-npm-install")
        if rc == 0:
            return
        await asyncio.sleep(NPM_INSTALL_BACKOFF_SEC * (attempt + 1))
    raise RuntimeError(f"npm install failed after {NPM_INSTALL_RETRIES} attempts (exit={rc}):\n{log[-1000:]}")


async def install_node22(sb: Sandbox, host_tarball: Path) -> None:
    """Unpack a Node.js tarball (.tar or .tar.xz, unpacked here first) at /opt/node22, linked into /usr/local/bin."""
    host_tarball = Path(host_tarball)
    if host_tarball.suffix == ".xz":
        plain = Path(tempfile.gettempdir()) / f"coding_agent_rl.{host_tarball.stem}.tar"
        if not plain.exists():
            partial = plain.with_suffix(".partial")
            with lzma.open(host_tarball, "rb") as src, open(partial, "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.replace(partial, plain)
        host_tarball = plain
    await sb.write_file("/tmp/node22.tar", host_tarball)
    links = " && ".join(f"ln -sf /opt/node22/bin/{b} /usr/local/bin/{b}" for b in ("node", "npm", "npx"))
    await sb.exec(
        f"set -e && mkdir -p /opt/node22 && tar xf /tmp/node22.tar -C /opt/node22 --strip-components=1 && {links} "
        "&& node --version && npm --version",
        user="root",
        timeout=180,
        check=True,
    )


class ClaudeCodeHarness(BaseHarness):
    """Claude Code, headless."""

    name = "claude_code"
    node_tarball_env = "SLIME_AGENT_NODE_TARBALL"
    cli_tarball_env = "SLIME_AGENT_CC_TARBALL"
    extra_args_env = "SLIME_AGENT_CC_EXTRA_ARGS"
    extra_envs_env = "SLIME_AGENT_CC_EXTRA_ENVS"
    launch_flags = (
        "--permission-mode bypassPermissions --output-format stream-json --include-partial-messages --verbose"
    )
    static_env = {  # noqa: RUF012
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS": "1",
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }

    def binary(self, sb: Sandbox) -> str:
        """The CLI in this sandbox: on the PATH of a local one, where npm put it in an E2B one."""
        return "claude" if is_local(sb) else "/usr/local/bin/claude"

    async def install_cli(self, sb: Sandbox) -> None:
        if is_local(sb):
            return await check_cli(sb, "claude --version", "Claude Code (@anthropic-ai/claude-code)")
        await install_npm_cli(
            sb,
            node_runtime=Path(os.environ[self.node_tarball_env]),
            npm_package=Path(os.environ[self.cli_tarball_env]),
            check_cmd="/usr/local/bin/claude --version",
        )

    async def write_config(self, sb: Sandbox, ctx: HarnessContext) -> None:
        """Onboarding done and bypass-permissions accepted, so that it starts headless."""
        settings = json.dumps({"hasCompletedOnboarding": True, "bypassPermissionsModeAccepted": True})
        for path in (f"{HOME}/.claude.json", f"{HOME}/.claude/settings.json"):
            await sb.write_file(path, settings, user="agent")
        if not is_local(sb):
            await sb.exec(f"chown -R agent:agent {HOME}/.claude {HOME}/.claude.json", user="root", check=True)

    def command(self, sb: Sandbox, prompt: str, ctx: HarnessContext) -> str:
        """The shell command that runs it on `prompt`."""
        extra = f"{os.environ.get(self.extra_args_env, '')} {ctx.extra_args}".strip()
        return f"{self.binary(sb)} -p {shlex.quote(prompt)} {self.launch_flags} {extra}".strip()

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        """Its environment: the endpoint, the key, the model's label, no other traffic."""
        env = {
            "ANTHROPIC_BASE_URL": ctx.adapter_url,
            "ANTHROPIC_AUTH_TOKEN": ctx.token,
            # Claude Code 2.1 answers a model name it does not know with a canned error and never calls: it gets a
            # Claude name (SLIME_AGENT_CC_MODEL); the endpoint serves its own model whatever the name.
            "ANTHROPIC_MODEL": os.environ.get("SLIME_AGENT_CC_MODEL") or "claude-sonnet-4-5",
            **self.static_env,
        }
        extra = os.environ.get(self.extra_envs_env, "").strip()
        return {**env, **json.loads(extra)} if extra else env

    async def launch_and_wait(self, sb: Sandbox, ctx: HarnessContext, prompt: str, time_budget_sec: int) -> int:
        cmd, env = self.command(sb, prompt, ctx), self.env(ctx)
        return await run_agent(sb, workdir=ctx.workdir, start_cmd=cmd, env=env, time_budget_sec=time_budget_sec)


class CodexHarness(BaseHarness):
    """Codex, non-interactive."""

    name = "codex"
    node_tarball_env = "SLIME_AGENT_NODE_TARBALL"
    cli_tarball_env = "SLIME_AGENT_CODEX_TARBALL"
    extra_args_env = "SLIME_AGENT_CODEX_EXTRA_ARGS"
    extra_envs_env = "SLIME_AGENT_CODEX_EXTRA_ENVS"
    exec_flags = "--skip-git-repo-check --dangerously-bypass-approvals-and-sandbox"
    # base_url inline: Codex reads a base URL from the environment for its built-in OpenAI provider only.
    config_toml = (
        'model = "{model}"\nmodel_provider = "slime"\n\n[model_providers.slime]\nname = "slime"\n'
        'base_url = "{base_url}"\nenv_key = "OPENAI_API_KEY"\nwire_api = "{wire_api}"\n'
        "\n[analytics]\nenabled = false\n"
    )

    async def install_cli(self, sb: Sandbox) -> None:
        if is_local(sb):
            return await check_cli(sb, "codex --version", "Codex (@openai/codex)")
        await install_npm_cli(
            sb,
            node_runtime=Path(os.environ[self.node_tarball_env]),
            npm_package=Path(os.environ[self.cli_tarball_env]),
            check_cmd="codex --version",
        )

    def config(self, ctx: HarnessContext) -> str:
        """~/.codex/config.toml: the adapter as its model provider."""
        wire_api = os.environ.get("SLIME_AGENT_CODEX_WIRE_API", "responses")
        return self.config_toml.format(model=ctx.model_label, base_url=f"{ctx.adapter_url}/v1", wire_api=wire_api)

    async def write_config(self, sb: Sandbox, ctx: HarnessContext) -> None:
        await sb.write_file(f"{HOME}/.codex/config.toml", self.config(ctx), user="agent")
        if not is_local(sb):
            await sb.exec(f"chown -R agent:agent {HOME}/.codex", user="root", check=True)

    def command(self, prompt: str, ctx: HarnessContext) -> str:
        """The shell command that runs it on `prompt`."""
        extra = f"{os.environ.get(self.extra_args_env, '')} {ctx.extra_args}".strip()
        return " ".join(part for part in ("codex exec", self.exec_flags, extra, shlex.quote(prompt)) if part)

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        """Its environment: the key (sent as `Authorization: Bearer`), the base URL."""
        env = {"OPENAI_API_KEY": ctx.token, "OPENAI_BASE_URL": f"{ctx.adapter_url}/v1"}
        extra = os.environ.get(self.extra_envs_env, "").strip()
        return {**env, **json.loads(extra)} if extra else env

    async def launch_and_wait(self, sb: Sandbox, ctx: HarnessContext, prompt: str, time_budget_sec: int) -> int:
        cmd, env = self.command(prompt, ctx), self.env(ctx)
        return await run_agent(sb, workdir=ctx.workdir, start_cmd=cmd, env=env, time_budget_sec=time_budget_sec)
