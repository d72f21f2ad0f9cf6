"""Flags of the trainer: Megatron parallelism and optimizer (Megatron's own names), algorithm, checkpoints."""

from __future__ import annotations

import argparse


def add_megatron_arguments(parser: argparse.ArgumentParser) -> None:
    """Megatron's flags, under Megatron-LM's names so launch scripts move over unchanged."""
    g = parser.add_argument_group("megatron")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1)
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    g.add_argument("--expert-model-parallel-size", type=int, default=1)
    g.add_argument("--context-parallel-size", type=int, default=1)
    g.add_argument("--use-distributed-optimizer", action="store_true")
    g.add_argument("--bf16", action="store_true")
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--lr", type=float, default=1e-6)
    g.add_argument("--min-lr", type=float, default=0.0)
    g.add_argument("--lr-warmup-iters", type=int, default=0)
    g.add_argument("--lr-decay-style", default="constant", choices=["constant", "linear", "cosine"])
    g.add_argument("--weight-decay", type=float, default=0.0)
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.98)
    g.add_argument("--adam-eps", type=float, default=1e-8)
    g.add_argument("--clip-grad", type=float, default=1.0)
    g.add_argument(
        "--global-batch-size", type=int, default=None, help="samples per optimizer step (default: all of a rollout)"
    )
    g.add_argument("--max-tokens-per-gpu", type=int, default=4096, help="token budget of one packed micro-batch")
    t = parser.add_argument_group("training placement")
    t.add_argument("--actor-num-nodes", type=int, default=1)
    t.add_argument("--actor-num-gpus-per-node", type=int, default=1, help="trainer ranks per node (processes on CPU)")
    t.add_argument("--colocate", action="store_true", help="training and rollout share the same devices")
    t.add_argument("--num-rollout", type=int, required=True, help="rollout/train iterations to run")


def add_algorithm_arguments(parser: argparse.ArgumentParser) -> None:
    """Advantage estimator and policy-loss flags."""
    g = parser.add_argument_group("algorithm")
    g.add_argument("--advantage-estimator", default="grpo", choices=["grpo"])
    g.add_argument("--disable-grpo-std-normalization", action="store_true", help="Dr.GRPO: centre rewards only")
    g.add_argument("--eps-clip", type=float, default=0.2)
    g.add_argument(
        "--eps-clip-high", type=float, default=None, help="upper clip (DAPO clip-higher); default --eps-clip"
    )
    g.add_argument("--use-kl-loss", action="store_true", help="add a KL-to-reference term to the loss")
    g.add_argument("--kl-loss-coef", type=float, default=0.0)
    g.add_argument("--kl-loss-type", default="low_var_kl", choices=["k1", "k2", "k3", "low_var_kl"])
    g.add_argument("--entropy-coef", type=float, default=0.0)


def add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """Model source, checkpoint save/load and weight-update flags."""
    g = parser.add_argument_group("checkpoint")
    g.add_argument("--hf-checkpoint", required=True, help="HF model directory (weights, config, tokenizer)")
    g.add_argument("--save", default=None, help="directory for checkpoints")
    g.add_argument("--save-interval", type=int, default=None, help="save every N rollouts")
    g.add_argument("--load", default=None, help="checkpoint directory to resume from")
    w = parser.add_argument_group("weight update")
    w.add_argument("--update-weight-transport", default="distributed", choices=["distributed", "disk"])
    w.add_argument("--update-weight-buffer-size", type=int, default=512 * 1024**2, help="bytes per update bucket")
