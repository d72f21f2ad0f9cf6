"""slime's --rollout-external-engine-addrs on a real run: a "pre-launched" SGLang server (the session's server on
127.0.0.1, started by the fixture, not by the run) generates the rollouts behind the run's router, takes the run's
weight updates and is left running. The same run has slime's --release-train: the trainer's processes end after
each weight update and are rebuilt from the newest checkpoint, then checked against the server's weights."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rollout import sglang_client as client
from rollout.sglang_server import SGLangServer
from tests.conftest import REPO_ROOT

REWARD = "def reward(args, sample):\n    return float(sum(sample.tokens) % 3)\n"


def test_run_on_a_prelaunched_server_with_release_train(
    sglang_server: SGLangServer, tiny_qwen3: Path, tmp_path: Path
) -> None:
    rows = [{"prompt": f"{a}+{a}=", "label": str(2 * a)} for a in range(4)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "spread_rm.py").write_text(REWARD)
    out, url = tmp_path / "out", sglang_server.url
    addr = url.removeprefix("http://")
    before = client.weight_version(url)
    cmd = [
        sys.executable, "-m", "slime_like.train",
        "--hf-checkpoint", str(tiny_qwen3), "--prompt-data", str(tmp_path / "train.jsonl"),
        "--input-key", "prompt", "--label-key", "label", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
        "--num-rollout", "2", "--rollout-max-response-len", "3", "--rollout-top-k", "1",
        "--advantage-estimator", "reinforce_plus_plus", "--custom-rm-path", "spread_rm.reward", "--lr", "1e-2",
        "--rollout-external-engine-addrs", addr, "--release-train", "--save", str(tmp_path / "ckpt"),
        "--update-weight-transport", "disk", "--check-weight-update", "--save-debug-rollout-data",
        "--output-dir", str(out), "--ray-num-cpus", "2",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO_ROOT}", "OMP_NUM_THREADS": "1"}
    try:
        proc = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
        log = proc.stdout + proc.stderr
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
        assert sglang_server.process.is_running()  # the run never stops a server it did not start
        assert client.weight_version(url) == "2"  # both updates reached it
        assert f"external SGLang engine {url}" in log
        placement = json.loads((out / "placement.json").read_text())
        assert placement["engines"] == [] and [w["url"] for w in placement["router"]["workers"]] == [url]
        versions = [
            {json.loads(line)["weight_version"] for line in (out / "rollouts" / f"rollout_{i:06d}.jsonl").open()}
            for i in range(2)
        ]
        assert versions == [{0}, {1}]  # rollout 1 came from the weights the run pushed
        # --release-train: ranks ended after each update, rebuilt (new processes) from rollout 0's checkpoint, and
        # the rebuilt trainer's weights are those the server got (the check raises otherwise).
        released = re.findall(r"trainer ranks released \(pids \[(\d+)\]\)", log)
        rebuilt = re.findall(r"trainer ranks rebuilt \(pids \[(\d+)\]\) from (\S+)", log)
        assert len(released) == 2 and len(rebuilt) == 1, log[-3000:]
        assert rebuilt[0][0] != released[0] and rebuilt[0][1].endswith("iter_0000000")
        assert "after rebuilding the trainer: the servers match it" in log
    finally:  # the session's server goes back to the tiny model's weights and its version
        client.update_weights_from_disk(url, str(tiny_qwen3), before)


def test_an_address_that_does_not_answer_stops_the_start(tmp_path: Path) -> None:
    from rollout.external_engines import discover
    from slime_like.core.errors import EngineError
    from slime_like.core.process import free_port

    with pytest.raises(EngineError, match=r"127\.0\.0\.1:\d+ does not answer /health .* start the SGLang server"):
        discover([f"127.0.0.1:{free_port()}"], timeout=5)
