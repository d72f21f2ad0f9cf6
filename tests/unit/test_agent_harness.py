"""slime's harness contract (plugins/agent_harness.py): the CLIs' command lines, environments and config, pure."""

from __future__ import annotations

from plugins.agent_harness import ClaudeCodeHarness, CodexHarness, HarnessContext


class _Local:
    single_user = True


def test_claude_code_points_at_the_endpoint_with_the_key() -> None:
    ctx = HarnessContext("/testbed", "sid-1", "http://127.0.0.1:9/s/sid-1", api_key="secret", extra_args="--tools Bash")
    harness = ClaudeCodeHarness()
    assert harness is ClaudeCodeHarness()  # one instance per class, as slime's
    cmd = harness.command(_Local(), "fix it", ctx)
    assert cmd.startswith("claude -p 'fix it' --permission-mode bypassPermissions") and cmd.endswith("--tools Bash")
    env = harness.env(ctx)
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9/s/sid-1" and env["ANTHROPIC_AUTH_TOKEN"] == "secret"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"


def test_codex_gets_a_responses_provider_and_the_session_id_as_slimes_key() -> None:
    ctx = HarnessContext("/testbed", "sid-2", "http://127.0.0.1:9")
    harness = CodexHarness()
    assert 'base_url = "http://127.0.0.1:9/v1"' in harness.config(ctx) and 'wire_api = "responses"' in harness.config(
        ctx
    )
    assert harness.env(ctx)["OPENAI_API_KEY"] == "sid-2"  # no api_key: slime's adapters read the sid
    assert harness.command("go", ctx).startswith("codex exec --skip-git-repo-check --dangerously-bypass-approvals")
