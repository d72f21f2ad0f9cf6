"""slime.agent.harness.codex: plugins/agent_harness.py."""

from plugins.agent_harness import *  # noqa: F403
from plugins.agent_harness import (  # noqa: F401
    BaseHarness,
    ClaudeCodeHarness,
    CodexHarness,
    HarnessContext,
    install_node22,
    install_npm_cli,
    run_agent,
)
