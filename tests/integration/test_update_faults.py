"""An engine killed inside a weight update (--use-fault-tolerance), in a real run (Ray, two SGLang engines, the router,
Megatron): at chosen phases of chosen updates a hook (tests/integration/update_fault_hook.py) SIGKILLs the engine of
the update's last URL, or of its first. The update lands on the engine left, the fleet takes the dead one out and
restarts it at once; it joins the router only with the current weights: from the next update, which reaches it with
the others, or (delta weight sync) pulled to the current version on its host before (--check-weight-update checks
every engine after every update); the run finishes with every sample accounted for.

Three runs, one start-up each: every full-weight transport in one run (tests/integration/update_faults_driver.py
switches the transport between versions), LoRA adapters (two, multi-LoRA), delta sync.
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
from tests.integration.update_faults_driver import transport_at

# Per run: the transport of each version from the one named on ("1:tensor,3:distributed": versions 1-2 tensor), and
# each kill as version:phase[:first] (the update's last engine, or its first). Each kill restarts the engine and the
# next update waits for it, so kills follow one another. One restarted engine is killed in its first update, before
# it ever served (full, version 3: the soak's case of issue 35); the other kills take an engine in service, and from
# the second kill on that update brings the restarted one into service, in its transport. The phases around the send (start, paused, flushed,
# sent, tagged) are one protocol for every full-weight transport, delta's included (base.py): each is killed in some
# run, the send in each transport.
RUNS = {
    "full": ("1:tensor,3:distributed,4:disk,6:distributed",
             ["1:sending", "2:tagged:first", "3:sending:first", "4:sending", "5:sent:first"]),
    # Two adapters, one trained per rollout (one group each): every update carries only the one trained, and the
    # restarted engines (behind: version 2 reaches one, version 3 the other) need both.
    "lora": ("0:lora", ["1:start", "2:sent:first"]),
    # Every rollout starts once both engines serve: a restarted engine is caught up between updates.
    "delta": ("1:disk", ["1:paused", "2:start", "3:flushed"]),
}  # fmt: skip
# Rewards that differ within every group (two samples): every step moves the weights, a LoRA adapter's too (it starts
# as the base).
REWARD_PLUGIN = "def reward(args, sample):\n    return float(sample.index % 2)\n"
# After this phase the update is done (the version tagged; for LoRA, the swap, one request): the weight check finds it.
LANDED = {"lora": ":sent"}


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("task")
    (root / "parity_rm.py").write_text(REWARD_PLUGIN)
    for name, op in (("train", "+"), ("mul", "*")):  # the second: the second adapter's prompts
        rows = [{"prompt": f"{a}{op}{a}=", "label": str(2 * a)} for a in range(8)]
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (root / f"{name}.yaml").write_text(f"data: {root / name}.jsonl\nrank: 4\nalpha: 8\n")
    return root


@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", sorted(RUNS))
def test_an_engine_killed_inside_an_update_is_restarted_with_the_current_weights(
    case: str, tiny_qwen3: Path, task: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    out.mkdir()
    transports, plan = RUNS[case]
    batch, samples, rollouts = (1 if case == "lora" else 2), 2, int(plan[-1].split(":")[0]) + 1
    flags = {
        "lora": ["--lora-rank", "4", "--lora-alpha", "8", "--target-modules", "all-linear",
                 "--multi-lora-adapter", "add", str(task / "train.yaml"), "--multi-lora-adapter", "mul",
                 str(task / "mul.yaml")],
        "delta": [*delta_flags(tmp_path / "published", tmp_path / "local"),
                  "--custom-generate-function-path", "tests.integration.update_fault_hook.generate_with_every_engine"],
        "full": ["--update-weight-transport", "tensor"],
    }[case]  # fmt: skip
    cmd = [
        sys.executable, "-m", "tests.integration.update_faults_driver", "--hf-checkpoint", str(tiny_qwen3),
        *([] if case == "lora" else ["--prompt-data", str(task / "train.jsonl")]),  # LoRA: the adapters' own
        "--input-key", "prompt", "--label-key", "label",
        "--rollout-batch-size", str(batch), "--n-samples-per-prompt", str(samples), "--num-rollout", str(rollouts),
        "--rollout-max-response-len", "8", "--custom-rm-path", "parity_rm.reward", "--rollout-num-gpus", "2",
        "--lr", "1e-3",
        "--use-fault-tolerance", "--rollout-health-check-interval", "1", "--rollout-health-check-timeout", "5",
        *flags, "--update-weight-timeout", "15", "--update-weight-retries", "0",
        "--check-weight-update", "--save-debug-rollout-data", "--output-dir", str(out), "--ray-num-cpus", "4",
    ]  # fmt: skip
    env = {
        **os.environ, "PYTHONPATH": f"{task}:{REPO_ROOT}", "OMP_NUM_THREADS": "1", API_KEY_ENV: secrets.token_urlsafe(8),
        HOOK_ENV: "tests.integration.update_fault_hook.kill_at", "UPDATE_FAULT_KILLS": ",".join(plan),
        "UPDATE_FAULT_DIR": str(out), "UPDATE_FAULT_TRANSPORTS": "" if case == "lora" else transports,
    }  # fmt: skip
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-8000:]
    seconds = {r: round(m["time/update_weights"], 2) for r, m in enumerate(_rows(out)) if "time/update_weights" in m}
    print(f"{case}: seconds per weight update by rollout: {seconds}")
    kills = sorted(p.name for p in out.glob("kill-*.json"))
    assert kills == sorted(f"kill-{item.replace(':', '-')}.json" for item in plan), kills
    # Each kill: the fleet took the engine out during the update, which landed on the other one without a retry.
    assert output.count("failed during a weight update") == len(plan), output[-8000:]
    # A kill after the version was tagged is found by the weight check instead of the update.
    found_by_check = sum(item.split(":")[1] == LANDED.get(case, ":tagged")[1:] for item in plan)
    assert output.count("the engine fleet took out") == len(plan) - found_by_check, output[-8000:]
    checks = 2 if case == "lora" else 1  # multi-LoRA: each adapter's check finds it
    assert output.count("not checked, it died since") == found_by_check * checks, output[-8000:]
    assert "failed (attempt" not in output, output[-8000:]  # no retry, no fallback: a dead engine is not the channel's
    # After each kill the update reached the engine left; the next one reached both (a restarted one with the current
    # weights, checked: a LoRA engine each adapter, as the update brought it every one, not only the one trained).
    pattern = re.compile(r"weight version (\d+) over (\w+): servers match the trainer within \S+ \((\d+) servers\)")
    matches = [m.groups() for m in pattern.finditer(output)]
    killed = {int(item.split(":")[0]) for item in plan}
    first = 0 if case == "lora" else 1  # a LoRA run sends its adapters before the first rollout, as version 0
    expected = [(v, transport_at(v, transports, "?"), 1 if v in killed else 2) for v in range(first, rollouts + 1)]
    assert [(int(v), over, int(n)) for v, over, n in matches] == expected, matches
    records = _rows(out)
    assert output.count("; it serves once it holds the current weights") >= len(plan), output[-8000:]
    assert max(r.get("rollout/engines_restarted", 0) for r in records) >= len(plan) - 1
    joined = [int(v) for v in re.findall(r"engine \d+: \S+ on .* joined the router at weight version (\d+)", output)]
    # Delta sync: every restarted engine was pulled to the current version on its host and joined before the next
    # update (each rollout waited for it). Otherwise an engine joins at the update that reached it and survived.
    caught_up = [int(v) for v in re.findall(r"brought to weight version (\d+) from", output)]
    brought_in = {
        "full": [2, 4, 5, 6],  # the one restarted after 2's kill was killed at 3, before it served
        "lora": [2, 3],
        "delta": [1, 2, 3],
    }[case]
    assert joined == brought_in and caught_up == (brought_in if case == "delta" else []), output[-8000:]
    print(f"{case}: restarted engines joined at versions {joined}, {len(caught_up)} of them caught up")
    train = [r for r in records if any(k.startswith("train/") and k.endswith("loss") for k in r)]
    assert len(train) == rollouts
    assert all(r["rollout/groups_trained"] == batch and r["rollout/groups_failed"] == 0 for r in train)
    dumps = sorted((out / "rollouts").glob("rollout_*.jsonl"))
    dumped = [[json.loads(line) for line in f.read_text().splitlines()] for f in dumps]
    assert [len(s) for s in dumped] == [batch * samples] * rollouts
    assert all(s["status"] in ("completed", "truncated") for r in dumped for s in r)
    if case == "lora":  # one adapter per rollout, in turn, each step moving it: the checks compare moved adapters
        assert [{s["metadata"]["lora_adapter"] for s in r} for r in dumped] == [{"add"}, {"mul"}, {"add"}]
        assert all(r[f"train/{name}/grad_norm"] > 0 for r, name in zip(train, ["add", "mul", "add"], strict=True))


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
