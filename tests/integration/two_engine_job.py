"""The two-engine job of tests/integration/test_multinode.py (on a simulated cluster) and
tests/integration/test_delta_weight_sync.py (on one node, with slime's delta weight flags): a DP=2 trainer, two
engines, greedy rollouts, rewards that differ between prompts, the weight check after every update."""

from __future__ import annotations

import json
import sys
from pathlib import Path

# Deterministic and spread out: greedy responses (top-k 1), rewards that differ between prompts, a batch-normalised
# estimator (a greedy group has one response, so a group baseline would leave nothing to learn): every step has a
# gradient, so every weight version has something to send.
REWARD_PLUGIN = """
def reward(args, sample):
    return float(sum(sample.tokens) % 3)
"""


def write_task(root: Path) -> Path:
    """Four addition prompts and the reward plugin (spread_rm.reward) in `root`."""
    rows = [{"prompt": f"{a}+{a}=", "label": str(2 * a)} for a in range(4)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "spread_rm.py").write_text(REWARD_PLUGIN)
    return root


def job(model: Path, task: Path, out: Path, *extra: str, module: str = "slime_like.train") -> list[str]:
    """`python -m <module>` for 2 rollouts, disaggregated: DP=2 trainer, two engines, the weight check."""
    return [
        sys.executable, "-m", module,
        "--hf-checkpoint", str(model), "--prompt-data", str(task / "train.jsonl"),
        "--input-key", "prompt", "--label-key", "label",
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "2",
        "--rollout-max-response-len", "3", "--rollout-top-k", "1", "--router-policy", "round_robin",
        "--advantage-estimator", "reinforce_plus_plus", "--custom-rm-path", "spread_rm.reward",
        "--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "2", "--lr", "1e-2",
        "--update-weight-transport", "distributed", "--check-weight-update",
        "--output-dir", str(out), "--ray-num-cpus", "4", *extra,
    ]  # fmt: skip


def delta_flags(shared: Path, local: Path) -> tuple[str, ...]:
    """slime's delta weight sync from disk: `shared` is every node's --update-weight-disk-dir, `local` each host's
    checkpoint that the deltas patch."""
    return (
        "--update-weight-mode", "delta", "--update-weight-transport", "disk", "--update-weight-disk-dir", str(shared),
        "--update-weight-local-checkpoint-dir", str(local), "--update-weight-delta-encoding", "overwrite",
    )  # fmt: skip
