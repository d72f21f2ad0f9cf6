"""Shared by the algorithm tests and their torchrun worker: a fixed rollout and trainer-rank configs."""

from __future__ import annotations

from pathlib import Path

from buffer.train_data import TrainData
from slime_like.arguments import parse_args

# Two samples per prompt; the last two responses end with a token a tool wrote (loss mask 0).
TOKENS = [
    [5, 6, 7, 20, 21],
    [5, 6, 7, 22, 23, 24],
    [8, 9, 10, 25, 26, 27, 28],
    [8, 9, 10, 29, 30],
    [11, 12, 31, 32, 33],
    [11, 12, 34],
    [13, 14, 15, 16, 35, 36, 37, 38],
    [13, 14, 15, 16, 39, 40],
]
PROMPT_LENGTHS = [3, 3, 3, 3, 2, 2, 4, 4]
REWARDS = [1.0, 0.0, 1.0, 0.0, 0.5, 0.5, 0.0, 1.0]

# Configurations checked under DP=1 and DP=2 (name -> extra flags).
DP_CONFIGS = {
    "grpo-whiten-seqmean-kl-tis": [
        "--normalize-advantages", "--loss-agg-mode", "seq-mean-token-mean", "--use-kl-loss", "--kl-loss-coef",
        "0.1", "--kl-loss-type", "k3", "--entropy-coef", "0.01", "--use-tis", "--eps-clip-c", "3",
    ],
    "ppo-critic-gae": [
        "--advantage-estimator", "ppo", "--kl-coef", "0.05", "--gamma", "0.9", "--lambd", "0.95",
        "--critic-lr", "1e-2", "--normalize-advantages",
    ],
}  # fmt: skip


def make_data(rollout_log_probs: list[list[float]] | None = None) -> TrainData:
    """The fixed rollout: 8 samples in 4 groups, one masked tool token in two of them."""
    lengths = [len(t) - p for t, p in zip(TOKENS, PROMPT_LENGTHS, strict=True)]
    masks = [[1] * n for n in lengths]
    masks[6][-1] = 0
    masks[2][1] = 0
    return TrainData(
        tokens=[list(t) for t in TOKENS],
        response_lengths=lengths,
        loss_masks=masks,
        raw_rewards=list(REWARDS),
        group_ids=[0, 0, 1, 1, 2, 2, 3, 3],
        rollout_log_probs=rollout_log_probs or [[-6.0] * n for n in lengths],
        sample_indices=list(range(len(TOKENS))),
        weight_versions=[0] * len(TOKENS),
    )


def actor_args(hf_dir: str | Path, extra: list[str], dp: int = 1):
    """Arguments of a trainer rank on the fixed rollout: 2 optimizer steps per rollout, small micro-batches."""
    return parse_args(
        ["--hf-checkpoint", str(hf_dir), "--prompt-data", "x.jsonl", "--rollout-batch-size", "4",
         "--n-samples-per-prompt", "2", "--global-batch-size", "4", "--num-rollout", "2", "--lr", "1e-2",
         "--max-tokens-per-gpu", "12", "--rollout-max-response-len", "8", "--actor-num-gpus-per-node", str(dp),
         *extra]
    )  # fmt: skip


def run_config(
    actor_cls, hf_dir: str | Path, name: str, rank: int = 0, dp: int = 1, addr: str = "127.0.0.1", port: int = 0
) -> dict:
    """Two rollouts of a DP config; returns the metrics of each and the final policy weights."""
    actor = actor_cls(actor_args(hf_dir, DP_CONFIGS[name], dp), rank, addr, port)
    metrics = [actor.train(i, make_data()) for i in range(2)]
    weights = {k: v.clone() for k, v in actor.engine.export_hf_weights()}
    return {"metrics": metrics, "weights": weights}
