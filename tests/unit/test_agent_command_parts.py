"""plugins/agent_command.py without running anything: its settings, the task's placement, the environment, the output
tails, the files kept and the example reward (tests/integration/test_agent_command.py runs commands)."""

from __future__ import annotations

import asyncio
import json
import os
from argparse import Namespace
from pathlib import Path

import pytest

from plugins.agent_command import (
    RESULT_KEY,
    AgentCommandConfig,
    AgentCommandConfigError,
    OutputTail,
    answer_file_reward,
    build_argv,
    build_env,
    collect_files,
    last_line,
    render_task,
)
from slime_like.core.sample import Sample, Status


@pytest.fixture
def program(tmp_path: Path) -> Path:
    path = tmp_path / "agent.sh"
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_settings_default_and_resolve_the_program_without_following_a_venv_link(program: Path, tmp_path: Path) -> None:
    link = tmp_path / "venv-python"
    link.symlink_to(program)  # a venv's python is a link to the base interpreter: run the link, or it is not the venv
    config = AgentCommandConfig.from_args(Namespace(agent_command=[str(link), "{task_file}"], output_dir=str(tmp_path)))
    assert config.command == (str(link), "{task_file}")
    assert (config.task, config.task_format, config.keep_workdir) == ("file", "text", False)
    assert config.workdir == tmp_path / "agent_command"
    config = AgentCommandConfig.from_args(
        Namespace(agent_command="sh -c 'echo hi'", agent_command_timeout=2, agent_command_keep_files="answer.txt")
    )
    assert config.command[1:] == ("-c", "echo hi") and os.path.isabs(config.command[0])  # found on PATH
    assert config.timeout == 2.0 and config.keep_files == ("answer.txt",)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({}, "needs agent_command .* --custom-config-path"),
        ({"agent_command": []}, "needs agent_command"),
        ({"agent_command": ["/no/such/agent", "x"]}, "agent_command: /no/such/agent does not exist"),
        ({"agent_command": ["no-such-agent-program"]}, "'no-such-agent-program' is not an executable on PATH"),
        ({"agent_command_timout": 3}, r"unknown setting\(s\) agent_command_timout"),
        ({"agent_command_task": "pipe"}, "agent_command_task must be one of"),
        ({"agent_command_task_format": "yaml"}, "agent_command_task_format must be one of"),
        ({"agent_command": ["sh", "{task}"]}, "has {task} but agent_command_task is 'file'"),
        ({"agent_command_keep_workdir": "false"}, "agent_command_keep_workdir must be a bool, not 'false'"),
        ({"agent_command_timeout": "300"}, "agent_command_timeout must be a float"),
        ({"agent_command_timeout": 0}, "agent_command_timeout must be > 0"),
        ({"agent_command_keep_files": ["../x"]}, "must be a glob relative to the working directory"),
        ({"agent_command_env": ["A=1"]}, "agent_command_env must map"),
    ],
)
def test_settings_that_cannot_run_name_the_key(settings: dict, message: str) -> None:
    args = Namespace(**{"agent_command": ["sh"], **settings})
    if settings == {}:
        del args.agent_command
    with pytest.raises(AgentCommandConfigError, match=message):
        AgentCommandConfig.from_args(args)


def test_a_program_that_is_not_executable_is_named(tmp_path: Path) -> None:
    script = tmp_path / "agent.py"
    script.write_text("print()\n")
    with pytest.raises(AgentCommandConfigError, match=f"agent_command: {script} is not executable"):
        AgentCommandConfig.from_args(Namespace(agent_command=[str(script)]))


def test_the_task_as_text_or_messages() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Double 3."}]},
    ]
    assert render_task("Double 3.", "text") == "Double 3."
    assert render_task(messages, "text") == "Be brief.\n\nDouble 3."
    assert json.loads(render_task(messages, "messages")) == messages
    assert json.loads(render_task("Double 3.", "messages")) == [{"role": "user", "content": "Double 3."}]


def test_the_task_goes_in_as_the_last_argument_or_where_task_stands() -> None:
    workdir, task_file = Path("/w"), Path("/w/task.txt")
    assert build_argv(["a", "{workdir}/x"], "arg", "do {workdir}", workdir, task_file) == ["a", "/w/x", "do {workdir}"]
    assert build_argv(["a", "--q={task}", "-v"], "arg", "it", workdir, task_file) == ["a", "--q=it", "-v"]
    assert build_argv(["a", "{task_file}"], "file", "it", workdir, task_file) == ["a", "/w/task.txt"]
    assert build_argv(["a"], "stdin", "it", workdir, task_file) == ["a"]


def test_the_environment_carries_the_session_and_the_users_settings() -> None:
    base = {"PATH": "/bin", "HOME": "/h", "PYTHONPATH": "/repo", "NO_PROXY": "corp", "OPENAI_BASE_URL": "old"}
    extra = {"PYTHONPATH": None, "MY_DIR": "{workdir}/out", "OPENAI_API_KEY": "theirs"}
    url = "http://127.0.0.1:9/s/abc/v1"
    env = build_env(base, extra, url, "key", Path("/w"), Path("/w/task.json"))
    assert env["OPENAI_BASE_URL"] == url and env["OPENAI_API_KEY"] == env["ANTHROPIC_API_KEY"] == "key"
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9/s/abc"  # the Anthropic SDK adds /v1/messages
    assert env["AGENT_WORKDIR"] == "/w" and env["AGENT_TASK_FILE"] == "/w/task.json" and env["MY_DIR"] == "/w/out"
    assert "PYTHONPATH" not in env and env["PATH"] == "/bin" and env["HOME"] == "/h"
    assert env["NO_PROXY"] == "corp,127.0.0.1,localhost" and env["no_proxy"] == "127.0.0.1,localhost"


def test_output_tails_keep_the_end_and_say_what_was_cut() -> None:
    tail = OutputTail(7)
    for chunk in (b"first line\n", b"se", b"cond\n"):
        tail.feed(chunk)
    assert tail.total == 18 and tail.text() == "[11 bytes cut]\nsecond\n"
    short = OutputTail(100)
    short.feed(b"ok\n")
    assert short.text() == "ok\n"
    assert last_line("Traceback\n  ...\nValueError: no\n\n") == "ValueError: no" and last_line("") == ""


def test_kept_files_are_globbed_in_the_workdir_and_cut(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "answer.txt").write_text("42\n")
    (tmp_path / "logs" / "a.json").write_text("x" * 100)
    (tmp_path / "logs" / "b.json").write_bytes(b"\xff\xfe{}")
    outside = tmp_path.parent / f"{tmp_path.name}-secret"
    outside.write_text("not the agent's")
    (tmp_path / "link.txt").symlink_to(outside)
    files, cut = collect_files(tmp_path, ["answer.txt", "logs/*.json", "*.txt", "missing"], 10)
    assert files == {"answer.txt": "42\n", "logs/a.json": "x" * 10, "logs/b.json": "\ufffd\ufffd{}"}
    assert cut == ["logs/a.json"]


def test_the_answer_file_reward_reads_the_kept_file() -> None:
    args = Namespace(agent_command_keep_files=["*.txt"])
    sample = Sample(prompt="Double 2.", label="4", metadata={RESULT_KEY: {"files": {"answer.txt": " 4\n"}}})
    assert answer_file_reward(args, sample) == 1.0
    sample.metadata[RESULT_KEY]["files"] = {"answer.txt": "5"}
    assert answer_file_reward(args, sample) == 0.0
    sample.metadata[RESULT_KEY] = {"files": {}}  # the agent wrote no answer
    assert answer_file_reward(args, sample) == 0.0
    with pytest.raises(ValueError, match="agent_command_answer_file 'answer.txt' matches none of"):
        answer_file_reward(Namespace(agent_command_keep_files=["out.json"]), sample)


@pytest.mark.parametrize(
    ("record", "status", "error", "counter"),
    [
        ({"exit_code": 0}, Status.COMPLETED, None, None),
        (
            {"exit_code": 3, "stderr": "Traceback\nValueError: no\n"},
            Status.FAILED,
            "exited with code 3: ValueError: no",
            "agent_command_failed",
        ),  # fmt: skip
        (
            {"exit_code": -15, "timed_out": True},
            Status.FAILED,
            "timed out after 300s; its process group was killed",
            "agent_command_timeout",
        ),  # fmt: skip
        ({"exit_code": -15, "aborted": True}, Status.ABORTED, None, None),  # killed by the rollout's abort: runs again
    ],
)
def test_how_the_command_ended_sets_the_sample(
    monkeypatch: pytest.MonkeyPatch, record: dict, status: Status, error: str | None, counter: str | None
) -> None:
    """generate's mapping of an exit, a timeout and an abort, with run_openai_agent's handling of a raising agent."""
    import plugins.agent_command as plugin

    async def fake_run(config, base_url, api_key, sample, *, prefix, should_stop):
        assert base_url == "http://127.0.0.1:1/s/a/v1" and api_key == "key" and prefix == "r0-s5-"
        return {"timed_out": False, "aborted": False, "stderr": "", **record}

    async def fake_agent_runner(ctx, sample, sampling_params, agent, *, timeout):
        try:
            await agent("http://127.0.0.1:1/s/a/v1", "key", sample)
            sample.status = Status.COMPLETED
        except Exception as exc:  # as run_openai_agent: the agent's failure is its sample's
            sample.status = Status.FAILED
            sample.metadata["agent_error"] = f"agent raised {type(exc).__name__}: {exc}"
        return sample

    monkeypatch.setattr(plugin, "run_in_workdir", fake_run)
    monkeypatch.setattr(plugin, "run_openai_agent", fake_agent_runner)
    counts: dict[str, int] = {}
    ctx = Namespace(
        args=Namespace(agent_command=["sh"]), plugin_state={}, aborting=False, rollout_id=0,
        count=lambda key, n=1: counts.__setitem__(key, counts.get(key, 0) + n),
    )  # fmt: skip
    sample = asyncio.run(plugin.generate(ctx, Sample(prompt="hi", index=5), {}))
    assert sample.status == status and sample.metadata[RESULT_KEY]["exit_code"] == record["exit_code"]
    assert (error is None) == ("agent_error" not in sample.metadata)
    if error is not None:
        assert sample.metadata["agent_error"].endswith(error)
    assert counts == {"agent_command_runs": 1, **({counter: 1} if counter else {})}
