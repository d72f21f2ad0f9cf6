"""An agent is a command: plugins/agents/two_turn_agent.py run by plugins/agent_command.py from its own venv
(.venv-verifiers: it imports verifiers and openai 3, which the engine's venv cannot import) in a real rollout on the
session's SGLang server, its two OpenAI SDK calls going over HTTP to the sample's session; the file it leaves comes
back for the reward, the trained ids are the sampled ids, and the samples take a Megatron train step. Commands that
run past their timeout, fail, leave children behind or are aborted are killed with their process group."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import psutil
import pytest

from buffer.train_data import build_train_data
from plugins.agent_command import RESULT_KEY, AgentCommandConfigError, run_command
from plugins.verifiers_env import DEFAULT_PYTHON, REPO
from rollout.sglang_server import SGLangServer
from slime_like.core.sample import Status
from tests.integration.recorded_rollout import agent_args, one_train_step, recorded_rollout

AGENT = REPO / "plugins" / "agents" / "two_turn_agent.py"
SAMPLES = 2
LABEL = "3"
# A child that ignores SIGTERM (an ignored signal stays ignored across exec): only the group's SIGKILL ends it.
STUBBORN_CHILD = "(trap '' TERM; exec sleep 300) &"


def command_rollout(checkpoint: Path, root: Path, server: SGLangServer, config: dict, rows: list[dict], **kw):
    """One rollout of `rows` through plugins.agent_command with `config` (--custom-config-path)."""
    (root / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (root / "agent.yaml").write_text(json.dumps(config))  # JSON is YAML
    args = agent_args(
        checkpoint, root, "plugins.agent_command.generate", "--custom-config-path", str(root / "agent.yaml"),
        "--label-key", "label", *kw.pop("flags", ()), prompts=len(rows), **kw,
    )  # fmt: skip
    return recorded_rollout(args, server.url)


def gone(pid: int, within: float = 5.0) -> bool:
    """Whether process `pid` has ended (a zombie waiting for init to reap it counts as ended)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def agent_run(tiny_qwen3: Path, sglang_server: SGLangServer, tmp_path_factory: pytest.TempPathFactory):
    """SAMPLES agents in .venv-verifiers on one prompt: the groups, metrics, /generates sent and the run's root."""
    assert DEFAULT_PYTHON.exists(), "no .venv-verifiers: run `bash scripts/setup-verifiers.sh` (scripts/test.sh does)"
    root = tmp_path_factory.mktemp("agent-command")
    config = {
        "agent_command": [str(DEFAULT_PYTHON), str(AGENT), "--import", "verifiers", "{task_file}"],
        "agent_command_task_format": "messages",
        # Steers the tiny random model to answer one digit, so the reward from the file varies.
        "agent_command_env": {"AGENT_EXTRA_BODY": json.dumps({"regex": "[1-4]"})},
        "agent_command_keep_files": ["answer.txt", "versions.json"],
        "agent_command_timeout": 120,
    }
    rows = [{"prompt": [{"role": "user", "content": "Pick a digit from 1 to 4."}], "label": LABEL}]
    flags = ("--custom-rm-path", "plugins.agent_command.answer_file_reward")
    return *command_rollout(tiny_qwen3, root, sglang_server, config, rows, samples=SAMPLES, max_response_len=64, flags=flags), root  # fmt: skip


def test_an_agent_from_its_own_venv_answers_in_a_file_scored_and_trained_on_the_sampled_ids(
    agent_run, tiny_qwen3: Path
) -> None:
    import openai
    from transformers import AutoTokenizer

    groups, metrics, sent, root = agent_run
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3)
    (group,) = groups
    assert len(group) == SAMPLES and metrics["rollout/agent_command_runs"] == SAMPLES
    assert metrics["rollout/openai_turns"] == 2 * SAMPLES
    with pytest.raises(ModuleNotFoundError):
        import verifiers  # noqa: F401  (the agent's framework is not the engine's)
    for sample in group:
        assert sample.status == Status.COMPLETED, sample.metadata
        result = sample.metadata[RESULT_KEY]
        assert result["exit_code"] == 0 and not result["timed_out"] and not result["aborted"], result
        assert "turn 2:" in result["stdout"] and result["workdir"] is None
        versions = json.loads(result["files"]["versions.json"])
        assert versions["verifiers"] == "0.3.1" and versions["openai"] != openai.__version__ == "2.6.1"
        answer = result["files"]["answer.txt"]
        assert answer in {"1", "2", "3", "4"}
        assert sample.reward == float(answer == LABEL)  # answer_file_reward read the file the agent left

        # Trained ids == sampled ids, with SGLang's log-probs; what the model did not write has loss mask 0.
        response = sample.tokens[sample.prompt_length :]
        turns = sorted((r for r in sent if r["rid"].startswith(f"openai-{sample.index}-")), key=lambda r: len(r["input_ids"]))  # fmt: skip
        assert len(turns) == 2 and turns[1]["input_ids"][: len(turns[0]["input_ids"])] == turns[0]["input_ids"]
        pairs = [(int(t[1]), float(t[0])) for turn in turns for t in turn["out"]["meta_info"]["output_token_logprobs"]]
        mask = sample.loss_mask
        assert len(response) == len(mask) == len(sample.rollout_log_probs) == sample.response_length
        assert [t for t, m in zip(response, mask, strict=True) if m] == [t for t, _ in pairs]
        assert [lp for lp, m in zip(sample.rollout_log_probs, mask, strict=True) if m] == pytest.approx([lp for _, lp in pairs])  # fmt: skip
        assert all(lp == 0.0 for lp, m in zip(sample.rollout_log_probs, mask, strict=True) if not m)
        last = [t for t, _ in pairs][-len(turns[1]["out"]["meta_info"]["output_token_logprobs"]) :]
        assert tokenizer.decode(last, skip_special_tokens=True).strip() == answer  # the file holds the 2nd reply
    assert not any((root / "out" / "agent_command").iterdir())  # working directories are removed

    one_train_step(tiny_qwen3, build_train_data(groups))


def test_a_command_past_its_timeout_or_failing_fails_its_sample_and_its_group_is_killed(
    tiny_qwen3: Path, sglang_server: SGLangServer, tmp_path: Path
) -> None:
    config = {
        "agent_command": ["bash", "-c", "{task}"],  # the task is the script (arg mode)
        "agent_command_task": "arg",
        "agent_command_timeout": 2,
        "agent_command_kill_grace": 1,
    }
    rows = [
        {"prompt": f"{STUBBORN_CHILD} echo $!; wait", "label": ""},
        {"prompt": "echo no answer >&2; exit 3", "label": ""},
    ]
    groups, metrics, _ = command_rollout(tiny_qwen3, tmp_path, sglang_server, config, rows, samples=1, max_response_len=16)  # fmt: skip
    (slow,), (failing,) = sorted(groups, key=lambda g: "exit 3" in g[0].prompt)
    assert slow.status == failing.status == Status.FAILED
    assert metrics["rollout/agent_command_timeout"] == metrics["rollout/agent_command_failed"] == 1
    result = slow.metadata[RESULT_KEY]
    assert slow.metadata["agent_error"] == (
        "agent raised AgentCommandError: the agent command timed out after 2s; its process group was killed"
    )
    assert result["timed_out"] and 3.0 <= result["seconds"] < 15, result  # SIGTERM, then SIGKILL a second later
    assert gone(int(result["stdout"].strip()))  # the child that ignored SIGTERM went with its group
    assert failing.metadata["agent_error"].endswith("the agent command exited with code 3: no answer")
    assert failing.metadata[RESULT_KEY]["exit_code"] == 3 and not failing.metadata[RESULT_KEY]["timed_out"]


def test_a_missing_command_stops_the_run_naming_the_setting(
    tiny_qwen3: Path, sglang_server: SGLangServer, tmp_path: Path
) -> None:
    config = {"agent_command": [str(tmp_path / "no-such-agent"), "{task_file}"]}
    with pytest.raises(AgentCommandConfigError, match=f"agent_command: {tmp_path / 'no-such-agent'} does not exist"):
        command_rollout(
            tiny_qwen3, tmp_path, sglang_server, config, [{"prompt": "hi", "label": ""}], samples=1, max_response_len=8
        )


def test_an_abort_a_cancel_or_an_exit_leaves_no_process_of_the_command(tmp_path: Path) -> None:
    """run_command alone: its group is killed when the rollout aborts, when it is cancelled, and after it exits."""
    script = f"{STUBBORN_CHILD} echo $! > child.pid; "

    def run(body: str, **kw):
        kw = {"stdin": None, "timeout": 60, "kill_grace": 0.5, "output_bytes": 1000, **kw}
        return run_command(["bash", "-c", script + body], cwd=tmp_path, env=os.environ, **kw)

    def child() -> int:
        return int((tmp_path / "child.pid").read_text())

    async def main() -> None:
        stop_at = time.monotonic() + 1.0
        result = await run("exec sleep 300", should_stop=lambda: time.monotonic() > stop_at)
        assert result.aborted and not result.timed_out and result.exit_code == -15 and gone(child())

        task = asyncio.create_task(run("exec sleep 300"))
        while not (tmp_path / "child.pid").exists() or (tmp_path / "child.pid").stat().st_mtime < stop_at:
            await asyncio.sleep(0.05)
        stubborn = child()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert gone(stubborn)

        # It exits at once, leaving a child running: the child is killed, and the task went in on stdin.
        result = await run("cat", stdin=b"the task")
        assert result.exit_code == 0 and result.stdout == "the task" and gone(child())

    asyncio.run(main())
