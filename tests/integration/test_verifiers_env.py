"""prime-rl's verifiers environments trained unchanged: plugins/verifiers_double_env.py (a verifiers ToolEnv with a
Python tool and a rubric) loaded by verifiers in its own venv (.venv-verifiers, scripts/setup-verifiers.sh), its
dataset dumped as prompt data, its rollouts run by plugins/verifiers_env.py against the rollout's endpoint in a
real rollout on the session's SGLang server: the tool's results come back through the endpoint, the reward is the
rubric's, the trained ids are the sampled ids, and the samples take a Megatron train step on the typed batch."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from buffer.train_data import build_train_data
from plugins.verifiers_env import DEFAULT_PYTHON, REPO
from rollout.sglang_server import SGLangServer
from slime_like.core.sample import Status
from tests.integration.recorded_rollout import agent_args, one_train_step, recorded_rollout
from tests.integration.test_openai_agents_sdk import with_tools_template  # noqa: F401  (a fixture)

ENV = "plugins.verifiers_double_env"
# The tiny random model is steered to a `double` call in Qwen's format, as plugins/openai_agents_example.py does.
CALL = r'<tool_call>\n\{"name": "double", "arguments": \{"digit": "[1-4]"\}\}\n</tool_call>'
PROMPTS, SAMPLES = 2, 2


@pytest.fixture(scope="module")
def rollout_run(with_tools_template: Path, sglang_server: SGLangServer, tmp_path_factory: pytest.TempPathFactory):  # noqa: F811
    """One rollout of the environment's first PROMPTS prompts, SAMPLES each; the groups, metrics and /generates."""
    assert DEFAULT_PYTHON.exists(), "no .venv-verifiers: run `bash scripts/setup-verifiers.sh` (scripts/test.sh does)"
    root = tmp_path_factory.mktemp("verifiers")
    dump = [str(DEFAULT_PYTHON), "-m", "plugins.verifiers_worker", ENV, "--dump-dataset", str(root / "train.jsonl")]
    subprocess.run(
        [*dump, "--n", str(PROMPTS)], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, check=True, timeout=120
    )
    config = {
        "verifiers_env": ENV,
        "verifiers_env_args": {"max_turns": 2},
        "verifiers_sampling_args": {"extra_body": {"regex": CALL}},
    }
    (root / "verifiers.yaml").write_text(json.dumps(config))  # JSON is YAML
    args = agent_args(
        with_tools_template, root, "plugins.verifiers_env.generate",
        "--custom-rm-path", "plugins.verifiers_env.reward", "--sglang-tool-call-parser", "qwen25",
        "--label-key", "label", "--custom-config-path", str(root / "verifiers.yaml"),
        samples=SAMPLES, prompts=PROMPTS, max_response_len=256,
    )  # fmt: skip
    return recorded_rollout(args, sglang_server.url)


def test_the_environment_runs_its_tool_scores_and_trains_on_the_sampled_ids(
    rollout_run,
    with_tools_template: Path,  # noqa: F811
) -> None:
    from transformers import AutoTokenizer

    groups, metrics, sent = rollout_run
    tokenizer = AutoTokenizer.from_pretrained(with_tools_template)
    samples = [s for g in groups for s in g]
    assert [len(g) for g in groups] == [SAMPLES] * PROMPTS and metrics["rollout/verifiers_rollouts"] == len(samples)
    assert metrics["rollout/openai_turns"] == 2 * len(samples)  # max_turns=2: both turns call the tool
    for sample in samples:
        assert sample.status == Status.COMPLETED, sample.metadata
        response = sample.tokens[sample.prompt_length :]
        model = tokenizer.decode([t for t, m in zip(response, sample.loss_mask, strict=True) if m])
        context = tokenizer.decode([t for t, m in zip(response, sample.loss_mask, strict=True) if not m])
        calls = [json.loads(c.split("\n</tool_call>")[0]) for c in model.split("<tool_call>\n")[1:]]
        digits = [int(c["arguments"]["digit"]) for c in calls]
        assert len(digits) == 2
        # verifiers ran the tool on the first call's argument, and its result came back to the model as context.
        assert f"<tool_response>\n{2 * digits[0]}\n</tool_response>" in context
        result = sample.metadata["verifiers"]
        # The rubric, by hand: no final answer (both turns are tool calls), and 0.5 if a tool result is the answer.
        # Only the first call ran: the environment stops at max_turns before it would run the second.
        assert result["metrics"]["correct_answer"] == 0.0 and result["stop"] == "max_turns_reached"
        assert result["metrics"]["used_the_tool"] == float(2 * digits[0] == int(sample.label)), (result, digits)
        assert sample.reward == result["reward"] == 0.5 * result["metrics"]["used_the_tool"]
        # Trained ids == sampled ids: the model-masked tokens are, in order, exactly what SGLang sampled.
        turns = sorted((r for r in sent if r["rid"].startswith(f"openai-{sample.index}-")), key=lambda r: len(r["input_ids"]))  # fmt: skip
        sampled = [int(t[1]) for turn in turns for t in turn["out"]["meta_info"]["output_token_logprobs"]]
        assert [t for t, m in zip(response, sample.loss_mask, strict=True) if m] == sampled

    one_train_step(with_tools_template, build_train_data(groups))


def test_a_worker_that_cannot_load_or_dies_fails_its_samples_clearly_and_is_replaced() -> None:
    import asyncio
    import socket
    from argparse import Namespace

    from plugins.verifiers_env import WorkerError, worker_for

    with pytest.raises(ValueError, match="needs verifiers_env .* --custom-config-path"):
        worker_for(Namespace())
    with pytest.raises(WorkerError, match="cannot load verifiers environment 'no_such_env'"):
        worker_for(Namespace(verifiers_env="no_such_env"))
    args = Namespace(verifiers_env=ENV)
    worker = worker_for(args)
    assert worker_for(args) is worker  # one per environment, started once
    with socket.socket() as silent:  # an endpoint that accepts and never answers: the rollout hangs in its call
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        request = {"base_url": f"http://127.0.0.1:{silent.getsockname()[1]}/v1", "api_key": "k", "model": "policy",
                   "sampling_args": {}, "prompt": [{"role": "user", "content": "Double 1."}], "answer": "2"}  # fmt: skip

        async def run_and_kill() -> dict:
            pending = asyncio.ensure_future(worker.run(request))
            await asyncio.sleep(1.0)
            worker.proc.kill()
            return await asyncio.wait_for(pending, 30)

        with pytest.raises(WorkerError, match=f"the verifiers worker for '{ENV}' exited with code"):
            asyncio.run(run_and_kill())
    assert not worker.alive and worker_for(args).alive  # the next sample gets a new worker
    worker_for(args).close()
