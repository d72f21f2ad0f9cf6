"""slime's coding-agent harnesses (a CLI installed, configured and run to completion in a sandbox):
plugins/agent_harness.py."""

from plugins.agent_harness import BaseHarness, ClaudeCodeHarness, CodexHarness, HarnessContext

__all__ = ["BaseHarness", "ClaudeCodeHarness", "CodexHarness", "HarnessContext"]
