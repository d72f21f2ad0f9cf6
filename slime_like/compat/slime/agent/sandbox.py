"""slime.agent.sandbox: plugins/agent_sandbox.py (the protocol, E2BSandbox, the local backend)."""

from plugins.agent_sandbox import *  # noqa: F403
from plugins.agent_sandbox import (  # noqa: F401
    EXIT_TIME_BUDGET_EXCEEDED,
    E2BSandbox,
    ExecResult,
    FileContent,
    LocalSandbox,
    Sandbox,
    SandboxError,
    allow_port,
    ensure_agent_user,
    exec_and_wait,
)
