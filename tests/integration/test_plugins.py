"""Every rollout hook, exercised by a small plugin written here, against the session's real SGLang server.

Plugin tests send /generate straight to the server (router_url = the server's URL): the router is not what
they test (test_rollout_dynamic.py goes through it). The shipped examples in plugins/ run here too.
"""

from __future__ import annotations

import importlib
import json
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from buffer.train_data import build_train_data
from rollout.manager import RolloutManager
from rollout.sglang_server import SGLangServer
from slime_like.arguments import parse_args
from slime_like.core.errors import PluginError
from slime_like.core.sample import Status

PLUGIN = """
import asyncio
import dataclasses

from plugins.group_generate import generate_group
from rollout.generate import generate as default_generate

CALLS = {"gen": [], "group_gen": [], "group_rm": [], "buffer": [], "hook": [], "log": []}


async def gen(ctx, sample, params):
    CALLS["gen"].append(sample.index)
    sample.metadata["custom_generated"] = True
    return await default_generate(ctx, sample, params)


async def group_gen(ctx, group, params):
    CALLS["group_gen"].append([s.index for s in group])
    return await generate_group(ctx, group, params)


async def group_rm(args, group):
    CALLS["group_rm"].append([s.index for s in group])
    return [{"score": float(s.index % 2), "length": float(s.response_length)} for s in group]


def index_rm(args, sample):
    return 1.0 if sample.index % 4 == 0 else 0.0  # pass@1 = 1/4 with 4 samples per prompt


async def bad_rm(args, sample):
    if sample.index % 4 == 1:
        raise ConnectionError("reward service down")
    if sample.index % 4 == 2:
        await asyncio.sleep(3600)  # hangs: --rm-timeout must cut it off
    return 1.0


def odd_out_of_loss(args, group):
    return [s.index % 2 == 0 for s in group]


def plus_ten(args, group):
    return [s.reward + 10.0 for s in group]


def newest_first(args, groups, num_groups):
    CALLS["buffer"].append([g[0].group_index for g in groups])
    return list(reversed(groups))[:num_groups]


def first_hook(args, sample, rollout_id=None):
    CALLS["hook"].append((sample.index, rollout_id, sample.reward))
    sample.metadata["hooked_in"] = rollout_id


async def second_hook(args, sample, **kwargs):
    return dataclasses.replace(sample, metadata={**sample.metadata, "evaluation": kwargs["evaluation"]})


def bad_hook(args, sample):
    return 3


def log_rollout(rollout_id, args, samples, extra_metrics, rollout_time):
    CALLS["log"].append(("rollout", rollout_id, len(samples), extra_metrics["rollout/reward_mean"], rollout_time))
    return True  # skip the default logging


def log_eval(rollout_id, args, data, extra_metrics):
    CALLS["log"].append(("eval", rollout_id, {k: len(v["samples"]) for k, v in data.items()}, data["a"]["rewards"]))
    return False


class NoMethods:
    def __init__(self, args, tokenizer):
        pass
"""


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("plugins")
    rows = [{"prompt": f"What is {a} + {a}?", "label": str(2 * a)} for a in range(20)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "eval_a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    (root / "eval_b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[3:5]))
    (root / "hooks_under_test.py").write_text(PLUGIN)
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))
    sys.modules.pop("hooks_under_test", None)


def calls() -> dict[str, list]:
    return importlib.import_module("hooks_under_test").CALLS


def args_for(model: Path, task: Path, *extra: str, data: bool = True) -> Any:
    return parse_args(
        [
            "--hf-checkpoint", str(model), *(["--prompt-data", str(task / "train.jsonl")] if data else []),
            "--input-key", "prompt", "--label-key", "label",
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--num-rollout", "1",
            "--rollout-max-response-len", "4", "--output-dir", str(task / "out"), *extra,
        ]
    )  # fmt: skip


@pytest.fixture
def make(tiny_qwen3: Path, task: Path, sglang_server: SGLangServer) -> Iterator[Any]:
    """Build a RolloutManager on the session server from extra flags; shut every one down afterwards."""
    made: list[RolloutManager] = []

    def build(*extra: str, data: bool = True) -> RolloutManager:
        for v in calls().values():
            v.clear()
        m = RolloutManager(
            args_for(tiny_qwen3, task, *extra, data=data),
            server_urls=[sglang_server.url],
            router_url=sglang_server.url,
        )
        made.append(m)
        return m

    yield build
    for m in made:
        m.shutdown()


def test_per_sample_generate_and_group_rm_with_dict_rewards(make: Any) -> None:
    m = make(
        "--custom-generate-function-path", "hooks_under_test.gen",
        "--custom-rm-path", "hooks_under_test.group_rm", "--group-rm", "--reward-key", "score",
    )  # fmt: skip
    groups, metrics = m.generate(0)
    indices = [[s.index for s in g] for g in groups]
    assert sorted(calls()["gen"]) == list(range(8)) and calls()["group_rm"] == indices  # one reward call a group
    assert all(s.metadata["custom_generated"] and s.reward["length"] == s.response_length for g in groups for s in g)
    assert metrics["rollout/reward_mean"] == 0.5  # read at --reward-key score
    assert build_train_data(groups, reward_key="score").raw_rewards == [float(i % 2) for i in range(8)]


def test_group_generate_calls_once_per_group(make: Any) -> None:
    m = make("--custom-generate-function-path", "hooks_under_test.group_gen", "--group-generate")
    groups, _ = m.generate(0)
    assert calls()["group_gen"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert all(s.response_length > 0 and s.status in (Status.COMPLETED, Status.TRUNCATED) for g in groups for s in g)


def test_rollout_function_sample_filter_and_reward_post_process(make: Any) -> None:
    m = make(
        "--rollout-function-path", "plugins.rollout_function.rollout",
        "--custom-rm-path", "hooks_under_test.index_rm",
        "--rollout-sample-filter-path", "hooks_under_test.odd_out_of_loss",
        "--custom-reward-post-process-path", "hooks_under_test.plus_ten",
    )  # fmt: skip
    groups, metrics = m.generate(0)
    samples = [s for g in groups for s in g]
    assert len(groups) == 2 and metrics["rollout/custom_rollout_groups"] == 2  # the plugin's own counter
    assert metrics["rollout/samples_excluded_from_loss"] == 4
    assert all(sum(s.loss_mask) == (s.response_length if s.index % 2 == 0 else 0) for s in samples)
    assert [s.reward for s in samples] == [s.metadata["raw_reward"] + 10.0 for s in samples]
    assert metrics["rollout/reward_mean"] == 0.25 and metrics["rollout/reward_processed_mean"] == 10.25


def test_sample_hooks_run_in_order_before_scoring(make: Any, task: Path) -> None:
    hooks = ["--rollout-sample-hook-path", "hooks_under_test.first_hook"]
    hooks += ["--rollout-sample-hook-path", "hooks_under_test.second_hook"]
    evals = ["--eval-prompt-data", "a", str(task / "eval_a.jsonl"), "--eval-max-response-len", "2"]
    logs = ["--custom-rollout-log-function-path", "hooks_under_test.log_rollout"]
    logs += ["--custom-eval-rollout-log-function-path", "hooks_under_test.log_eval"]
    m = make(*hooks, *evals, *logs, "--custom-rm-path", "hooks_under_test.index_rm")
    groups, metrics = m.generate(5)
    assert sorted(i for i, _, _ in calls()["hook"]) == list(range(8))
    assert {(rollout_id, reward) for _, rollout_id, reward in calls()["hook"]} == {(5, None)}  # not scored yet
    samples = [s for g in groups for s in g]  # the second hook's replacements, scored
    assert all(s.metadata["hooked_in"] == 5 and s.metadata["evaluation"] is False for s in samples)
    assert [s.reward for s in samples] == [1.0 if s.index % 4 == 0 else 0.0 for s in samples]
    # slime's log function saw the rollout's 8 samples and said to skip the default sample metrics.
    (log,) = calls()["log"]
    assert log[:4] == ("rollout", 5, 8, 0.25) and log[4] > 0
    assert "rollout/reward_mean" not in metrics and "rollout/time" in metrics
    calls()["hook"].clear()
    eval_metrics = m.evaluate(5)
    assert len(calls()["hook"]) == 3  # one greedy sample per eval prompt
    assert calls()["log"][1] == ("eval", 5, {"a": 3}, [1.0 if s % 4 == 0 else 0.0 for s in (0, 1, 2)])
    assert "eval/a/reward_mean" in eval_metrics  # the eval log function returned False: defaults stay
    bad = make("--rollout-sample-hook-path", "hooks_under_test.bad_hook")
    with pytest.raises(Exception, match="--rollout-sample-hook-path='hooks_under_test.bad_hook' returned int"):
        bad.generate(0)


def test_buffer_filter_chooses_returned_groups(make: Any) -> None:
    m = make("--buffer-filter-path", "hooks_under_test.newest_first")
    m.buffer.add_groups(m.buffer.get_groups(3))  # groups 0, 1, 2 handed back, e.g. by an aborted rollout
    groups, _ = m.generate(0)
    assert calls()["buffer"] == [[0, 1, 2]]
    assert sorted(g[0].group_index for g in groups) == [1, 2] and m.buffer.returned_groups()[0][0].group_index == 0


def test_eval_over_two_datasets_with_pass_at_k(make: Any, task: Path) -> None:
    evals = ["--eval-prompt-data", "a", str(task / "eval_a.jsonl"), "b", str(task / "eval_b.jsonl")]
    flags = [*evals, "--n-samples-per-eval-prompt", "4", "--eval-temperature", "1.0"]
    m = make(*flags, "--custom-rm-path", "hooks_under_test.index_rm", "--eval-max-response-len", "3")
    metrics = m.evaluate(0)
    for name, prompts in (("a", 3), ("b", 2)):
        assert metrics[f"eval/{name}/num_samples"] == 4 * prompts
        assert metrics[f"eval/{name}/reward_mean"] == 0.25
        # One correct sample of 4 per prompt: pass@k = 1 - C(3, k) / C(4, k).
        assert metrics[f"eval/{name}/pass@1"] == 0.25 and metrics[f"eval/{name}/pass@2"] == 0.5
        assert metrics[f"eval/{name}/pass@4"] == 1.0
        assert metrics[f"eval/{name}/response_len_mean"] <= 3
    assert metrics["eval/reward_mean"] == 0.25
    custom = make(*flags, "--eval-function-path", "plugins.majority_eval.evaluate_with_majority", "--rm-type", "dapo")
    metrics = custom.evaluate(0)
    assert {"eval/a/maj@4", "eval/b/maj@4", "eval/a/pass@4", "eval/b/reward_mean"} <= set(metrics)


def test_eval_config_gives_each_dataset_its_own_fields(make: Any, task: Path) -> None:
    """slime's --eval-config: per-dataset sample counts, lengths and rewards (custom_rm_path here, rm_type there)."""
    config = task / "eval.yaml"
    config.write_text(f"""eval:
  defaults: {{max_response_len: 3, temperature: 1.0}}
  datasets:
  - {{name: a, path: {task / "eval_a.jsonl"}, n_samples_per_eval_prompt: 4, custom_rm_path: hooks_under_test.index_rm}}
  - {{name: b, path: {task / "eval_b.jsonl"}, max_response_len: 5, rm_type: exact}}
""")
    metrics = make("--eval-config", str(config)).evaluate(0)
    assert (metrics["eval/a/num_samples"], metrics["eval/b/num_samples"]) == (12, 2)  # 4 each, then the flag's 1
    assert metrics["eval/a/reward_mean"] == 0.25 and metrics["eval/a/pass@4"] == 1.0  # its own reward function
    assert metrics["eval/b/reward_mean"] == 0.0 and "eval/b/pass@2" not in metrics  # exact: never "6" or "8"
    assert metrics["eval/a/response_len_mean"] <= 3 and metrics["eval/b/response_len_mean"] <= 5


def test_data_source_plugin_with_reasoning_gym_scorer(make: Any) -> None:
    m = make("--data-source-path", "plugins.data_sources.ReasoningGymSource", "--rm-type", "reasoning_gym", data=False)
    groups, metrics = m.generate(0)
    assert [g[0].metadata["source_dataset"] for g in groups] == ["basic_arithmetic", "chain_sum"]
    # Scored in the worker processes: junk answers score 0, and no scoring failed.
    assert all(s.reward == 0.0 and s.status != Status.FAILED for g in groups for s in g)
    assert "rollout/reward_failed" not in metrics
    assert m.state_dict()["source"] == {"next_group_index": 2}


def test_reward_that_raises_or_hangs_is_counted_and_the_rollout_completes(make: Any) -> None:
    m = make("--custom-rm-path", "hooks_under_test.bad_rm", "--rm-timeout", "1")
    start = time.monotonic()
    groups, metrics = m.generate(0)
    assert time.monotonic() - start < 30
    by_kind = {k: [s for g in groups for s in g if s.index % 4 == k] for k in range(4)}
    assert all("reward service down" in s.metadata["reward_error"] for s in by_kind[1])
    assert all(s.metadata["reward_error"] == "timed out" for s in by_kind[2])
    assert all(s.status == Status.FAILED and s.reward == 0.0 for k in (1, 2) for s in by_kind[k])
    assert all(s.reward == 1.0 and s.status != Status.FAILED for k in (0, 3) for s in by_kind[k])
    assert metrics["rollout/reward_failed"] == 4 and metrics["rollout/reward_timeout"] == 2
    assert len(build_train_data(groups)) == 4  # failed samples do not train


class RewardHandler(BaseHTTPRequestHandler):
    """A reward service: the reward is the response's length in characters / 100."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        answer = json.dumps({"reward": len(body["response"]) / 100}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


def test_remote_reward_model_up_then_down(make: Any) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), RewardHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/reward"
    m = make("--rm-type", "remote", "--rm-url", url, "--rm-retries", "2", "--rm-timeout", "2")
    try:
        groups, metrics = m.generate(0)
        assert all(s.reward == len(s.response) / 100 and s.status != Status.FAILED for g in groups for s in g)
        assert "rollout/rm_remote_failures" not in metrics
    finally:
        server.shutdown()
        server.server_close()  # the reward service is down from here on
    groups, metrics = m.generate(1)
    assert all(s.status == Status.FAILED and "--rm-url" in s.metadata["reward_error"] for g in groups for s in g)
    assert metrics["rollout/reward_failed"] == metrics["rollout/rm_remote_failures"] == 8
    assert metrics["rollout/rm_remote_retries"] == 16  # 2 retries per sample, with backoff


def test_bad_plugins_fail_before_any_server_starts(
    tiny_qwen3: Path, task: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        args_for(tiny_qwen3, task, "--dynamic-sampling-filter-path", "hooks_under_test.gen")
    assert "--dynamic-sampling-filter-path='hooks_under_test.gen': must be a plain function" in capsys.readouterr().err
    args = args_for(tiny_qwen3, task, "--data-source-path", "hooks_under_test.NoMethods")
    start = time.monotonic()
    with pytest.raises(PluginError, match="--data-source-path=.*no get_groups, state_dict, load_state_dict"):
        RolloutManager(args)  # would start a server and a router if the check came later
    assert time.monotonic() - start < 10
