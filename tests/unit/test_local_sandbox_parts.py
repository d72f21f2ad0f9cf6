"""The local sandbox's pure parts: bwrap's command line, the sandbox's users and environment."""

from __future__ import annotations

from pathlib import Path

from plugins.local_sandbox import CTL_DIR, HOME, SANDBOX_UID, base_env, bwrap_argv, passwd_files


def test_bwrap_binds_the_copy_read_write_and_the_system_read_only() -> None:
    argv = bwrap_argv(Path("/sb"), "/workspace/repo", {"/opt/agents": "/cli"}, [8123], {"A": "1"})
    pairs = {(argv[i], argv[i + 1], argv[i + 2]) for i in range(len(argv) - 2)}
    assert argv[:2] == ["bwrap", "--unshare-all"] and "--die-with-parent" in argv and "--share-net" not in argv
    assert ("--bind", "/sb/work", "/workspace/repo") in pairs and ("--bind", "/sb/home", HOME) in pairs
    assert ("--ro-bind", "/usr", "/usr") in pairs and ("--ro-bind", "/etc", "/etc") in pairs
    assert ("--ro-bind", "/sb/ctl", CTL_DIR) in pairs and ("--ro-bind", "/cli", "/opt/agents") in pairs
    assert ("--setenv", "A", "1") in pairs and "--clearenv" in argv
    assert argv[-2:] == [f"{CTL_DIR}/init.py", "8123"]  # the init bridges the endpoint's port
    binds = [argv[i + 1] for i, a in enumerate(argv) if a == "--bind"]
    assert sorted(binds) == ["/sb/home", "/sb/tmp", "/sb/work"]  # nothing else of the host is writable


def test_one_user_named_agent() -> None:
    passwd, group = passwd_files()
    assert f"agent:x:{SANDBOX_UID}:{SANDBOX_UID}:agent:{HOME}:/bin/bash" in passwd.splitlines()
    assert f"agent:x:{SANDBOX_UID}:" in group.splitlines()
    env = base_env("/w")
    assert env["HOME"] == HOME and env["SANDBOX_WORKDIR"] == "/w" and "127.0.0.1" in env["NO_PROXY"]
