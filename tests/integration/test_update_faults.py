"""An engine killed inside a weight update (--use-fault-tolerance), in a real run (Ray, two SGLang engines, the router,
Megatron): at chosen phases of chosen updates a hook (tests/integration/update_fault_hook.py) SIGKILLs the engine of
the update's last URL. The update lands on the engine left, the fleet takes the dead one out and restarts it at once;
it joins the router only with the current weights: from the next update, which reaches it with the others, or (delta
weight sync) pulled to the current version on its host before (--check-weight-update checks every engine after every
update); the run finishes with every sample accounted for. Per transport, and for LoRA adapters and delta sync.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from slime_like.core.secret import API_KEY_ENV
from slime_like.trainer.weights.base import HOOK_ENV
from tests.conftest import REPO_ROOT
from tests.integration.two_engine_job import delta_flags

BATCH, N, ROLLOUTS = 4, 4, 5

# Per transport: (weight version, phase) of each kill. Version 3's engine is the one restarted after version 2's
# kill, killed before the update that brings it into service (the soak's case in issue 35).
PLANS = {
    "distributed": ["2:start", "3:start", "4:sending"],
    "disk": ["2:paused", "3:sending", "4:sent"],
    "tensor": ["2:flushed", "3:sending", "4:tagged"],  # tagged: the update landed; the check's probe finds it dead
    "lora": ["2:start", "3:start", "4:sent"],  # the adapter's swap is one request: before it, and after it landed
    "delta": ["2:paused", "3:start", "4:flushed"],
}
# After this phase the update is done (the version tagged; for LoRA, the swap, one request): the weight check finds it.
LANDED = {"lora": ":sent"}


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("task")
    rows = [{"prompt": f"{a}+{a}=", "label": str(2 * a)} for a in range(8)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


@pytest.mark.timeout(900)
@pytest.mark.parametrize("transport", sorted(PLANS))
def test_an_engine_killed_inside_an_update_is_restarted_with_the_current_weights(
    transport: str, tiny_qwen3: Path, task: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    out.mkdir()
    flags = {
        "lora": ["--lora-rank", "4", "--lora-alpha", "8", "--target-modules", "all-linear"],
        "delta": list(delta_flags(tmp_path / "published", tmp_path / "local")),
    }.get(transport, ["--update-weight-transport", transport])
    cmd = [
        sys.executable, "-m", "slime_like.train", "--hf-checkpoint", str(tiny_qwen3),
        "--prompt-data", str(task / "train.jsonl"), "--input-key", "prompt", "--label-key", "label",
        "--rollout-batch-size", str(BATCH), "--n-samples-per-prompt", str(N), "--num-rollout", str(ROLLOUTS),
        "--rollout-max-response-len", "24", "--rollout-num-gpus", "2", "--lr", "1e-3",
        "--use-fault-tolerance", "--rollout-health-check-interval", "1", "--rollout-health-check-timeout", "5",
        *flags, "--update-weight-timeout", "15", "--update-weight-retries", "0",
        "--check-weight-update", "--save-debug-rollout-data", "--output-dir", str(out), "--ray-num-cpus", "4",
    ]  # fmt: skip
    plan = PLANS[transport]
    env = {
        **os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", API_KEY_ENV: secrets.token_urlsafe(8),
        HOOK_ENV: "tests.integration.update_fault_hook.kill_at", "UPDATE_FAULT_KILLS": ",".join(plan),
        "UPDATE_FAULT_DIR": str(out),
    }  # fmt: skip
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-8000:]
    seconds = {r: m["time/update_weights"] for r, m in enumerate(_rows(out)) if "time/update_weights" in m}
    print(f"{transport}: seconds per weight update by rollout: {seconds}")
    kills = sorted(p.name for p in out.glob("kill-*.json"))
    assert kills == sorted(f"kill-{item.replace(':', '-')}.json" for item in plan), kills
    # Each kill: the fleet took the engine out during the update, which landed on the other one without a retry.
    assert output.count("failed during a weight update") == len(plan), output[-8000:]
    # A kill after the version was tagged is found by the weight check instead of the update.
    found_by_check = sum(item.endswith(LANDED.get(transport, ":tagged")) for item in plan)
    assert output.count("the engine fleet took out") == len(plan) - found_by_check, output[-8000:]
    assert output.count("not checked, it died since") == found_by_check, output[-8000:]
    assert "failed (attempt" not in output, output[-8000:]  # no retry, no fallback: a dead engine is not the channel's
    # After each kill the update reached the engine left; the next one reached both (the restarted one with the
    # current weights, checked before it joined the router).
    pattern = re.compile(r"weight version (\d+) over (\w+): servers match the trainer within \S+ \((\d+) servers\)")
    matches = [m.groups() for m in pattern.finditer(output)]
    over = {"delta": "disk"}.get(transport, transport)
    first = 0 if transport == "lora" else 1  # a LoRA run sends its adapter before the first rollout, as version 0
    assert matches == [(str(v), over, "1" if 2 <= v <= 4 else "2") for v in range(first, ROLLOUTS + 1)], matches
    records = _rows(out)
    # Restarted at once after each kill, out of the router until it holds the current weights.
    assert output.count("; it serves once it holds the current weights") >= len(plan) - 1, output[-8000:]
    assert max(r.get("rollout/engines_restarted", 0) for r in records) >= len(plan) - 1
    joined = re.findall(r"engine \d+: \S+ on .* joined the router at weight version (\d+)", output)
    # (Those killed before their first update never joined; the one restarted after the last kill did, current.)
    assert joined and int(joined[-1]) >= ROLLOUTS - 1, output[-8000:]
    # Delta sync: a restart that is done before the next update is pulled to the current version on its host and
    # joins at once (on a busy machine the restart may take longer than a rollout: then the next update brings it).
    caught_up = re.findall(r"brought to weight version (\d+) from", output)
    assert set(caught_up) <= set(joined) and (transport == "delta" or not caught_up), output[-8000:]
    print(f"{transport}: restarted engines joined at versions {joined}, {len(caught_up)} of them caught up")
    train = [r for r in records if "train/loss" in r]
    assert len(train) == ROLLOUTS
    assert all(r["rollout/groups_trained"] == BATCH and r["rollout/groups_failed"] == 0 for r in train)
    dumps = sorted((out / "rollouts").glob("rollout_*.jsonl"))
    samples = [[json.loads(line) for line in f.read_text().splitlines()] for f in dumps]
    assert [len(s) for s in samples] == [BATCH * N] * ROLLOUTS
    assert all(s["status"] in ("completed", "truncated") for r in samples for s in r)


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
