"""One trainer rank: the Megatron engine plus the RL step (log-probs, advantages, PPO loss, weight push)."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import torch

from buffer.train_data import TrainData
from slime_like.algorithms.kl import kl_estimate
from slime_like.algorithms.policy_loss import ppo_clip_loss

logger = logging.getLogger(__name__)


def policy_loss_fn(args: Any, num_tokens: int):
    """The engine's loss_fn: PPO-clip (+ KL) summed over loss-masked tokens / all tokens of the step."""

    def loss_fn(logprobs: list[torch.Tensor], data: list[dict[str, Any]], entropy: list[torch.Tensor]):
        loss = logprobs[0].new_zeros(())
        stats = {"pg_clipfrac": 0.0, "ppo_kl": 0.0, "ppo_ratio_abs_dev": 0.0, "entropy": 0.0, "kl_loss": 0.0}
        for lp, e, d in zip(logprobs, entropy, data, strict=True):
            n = d["response_length"]
            resp_lp, mask = lp[-n:], d["loss_mask"]
            pg, ratio, clipped = ppo_clip_loss(
                resp_lp, d["old_log_probs"], d["advantages"], args.eps_clip, args.eps_clip_high
            )
            per_token = pg - args.entropy_coef * e[-n:]
            if args.use_kl_loss:
                kl = kl_estimate(resp_lp, d["ref_log_probs"], args.kl_loss_type)
                per_token = per_token + args.kl_loss_coef * kl
                stats["kl_loss"] += float((kl * mask).sum()) / num_tokens
            loss = loss + (per_token * mask).sum() / num_tokens
            stats["pg_clipfrac"] += float((clipped * mask).sum()) / num_tokens
            stats["ppo_ratio_abs_dev"] += float(((ratio.detach() - 1).abs() * mask).sum()) / num_tokens
            stats["ppo_kl"] += float(((d["old_log_probs"] - resp_lp.detach()) * mask).sum()) / num_tokens
            stats["entropy"] += float((e[-n:].detach() * mask).sum()) / num_tokens
        return loss, stats

    return loss_fn


class TrainActor:
    """A trainer rank; every rank gets the full rollout and the engine takes its DP share."""

    def __init__(self, args: Any, rank: int, master_addr: str, master_port: int) -> None:
        os.environ.update(
            RANK=str(rank),
            WORLD_SIZE=str(args.world_size),
            LOCAL_RANK=str(rank % args.actor_num_gpus_per_node),
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
        )
        from slime_like.megatron.engine import MegatronTrainEngine
        from slime_like.megatron.optimizer import OptimizerSettings
        from slime_like.megatron.parallel import init_parallel

        self.args = args
        self.rank = rank
        init_parallel(
            args.tensor_model_parallel_size,
            args.pipeline_model_parallel_size,
            args.expert_model_parallel_size,
            seed=args.seed,
        )
        settings = OptimizerSettings(
            lr=args.lr,
            min_lr=args.min_lr,
            weight_decay=args.weight_decay,
            clip_grad=args.clip_grad,
            adam_beta1=args.adam_beta1,
            adam_beta2=args.adam_beta2,
            adam_eps=args.adam_eps,
            use_distributed_optimizer=args.use_distributed_optimizer,
            lr_warmup_steps=args.lr_warmup_iters,
            lr_decay_steps=args.num_rollout * self.steps_per_rollout if args.lr_decay_style != "constant" else None,
            lr_decay_style=args.lr_decay_style,
        )
        self.engine = MegatronTrainEngine(
            args.hf_checkpoint,
            settings,
            max_tokens_per_micro_batch=args.max_tokens_per_gpu,
            dtype=torch.bfloat16 if args.bf16 else torch.float32,
            temperature=args.rollout_temperature,
        )
        # The reference policy is a frozen copy of the starting weights, swapped in for its forward.
        self.ref_weights = self._snapshot() if args.use_kl_loss else None
        self.transport = None

    @property
    def steps_per_rollout(self) -> int:
        """Optimizer steps per rollout (samples per rollout / --global-batch-size)."""
        return self.args.rollout_batch_size * self.args.n_samples_per_prompt // self.args.global_batch_size

    def _snapshot(self) -> dict[str, torch.Tensor]:
        return {
            k: v.detach().clone() for m in self.engine.model for k, v in m.state_dict().items() if torch.is_tensor(v)
        }

    def _forward_with_weights(self, weights: dict[str, torch.Tensor], tokens: list[list[int]]) -> list[torch.Tensor]:
        """Log-probs under other weights (the reference), then put the current ones back."""
        current = self._snapshot()
        self._load_weights(weights)
        try:
            return self.engine.forward_logprobs(tokens)
        finally:
            self._load_weights(current)

    def _load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for m in self.engine.model:
                for k, v in m.state_dict().items():
                    if k in weights and torch.is_tensor(v):
                        v.copy_(weights[k])

    def train(self, rollout_id: int, data: TrainData) -> dict[str, float]:
        """Recompute old (and ref) log-probs, then take the optimizer steps of this rollout."""
        start = time.monotonic()
        tokens = data.tokens
        old_lp = [lp[-n:] for lp, n in zip(self.engine.forward_logprobs(tokens), data.response_lengths, strict=True)]
        ref_lp = None
        if self.ref_weights is not None:
            full = self._forward_with_weights(self.ref_weights, tokens)
            ref_lp = [lp[-n:] for lp, n in zip(full, data.response_lengths, strict=True)]
        logprob_time = time.monotonic() - start
        rows = []
        for i in range(len(data)):
            mask = torch.tensor(data.loss_masks[i], dtype=torch.float32)
            row = {
                "response_length": data.response_lengths[i],
                "loss_mask": mask,
                "old_log_probs": old_lp[i],
                # GRPO: the group-normalised reward is every response token's advantage.
                "advantages": torch.full_like(mask, data.rewards[i]),
            }
            if ref_lp is not None:
                row["ref_log_probs"] = ref_lp[i]
            rows.append(row)
        metrics = self._mismatch_metrics(data, old_lp)
        per_step = self.args.global_batch_size
        step_metrics: list[dict[str, float]] = []
        for begin in range(0, len(data), per_step):
            idx = list(range(begin, min(begin + per_step, len(data))))
            num_tokens = max(1, int(sum(float(rows[i]["loss_mask"].sum()) for i in idx)))
            step_metrics.append(
                self.engine.train_step(
                    [tokens[i] for i in idx],
                    [rows[i] for i in idx],
                    policy_loss_fn(self.args, num_tokens),
                    with_entropy=True,
                )
            )
        for key in step_metrics[0]:
            metrics[f"train/{key}"] = sum(m[key] for m in step_metrics) / len(step_metrics)
        metrics["time/logprob"] = logprob_time
        metrics["time/train"] = time.monotonic() - start - logprob_time
        return metrics

    @staticmethod
    def _mismatch_metrics(data: TrainData, old_lp: list[torch.Tensor]) -> dict[str, float]:
        """How far SGLang's rollout log-probs are from Megatron's on the same tokens."""
        diffs = [
            (lp - torch.tensor(r, dtype=lp.dtype)).abs() * torch.tensor(m, dtype=lp.dtype)
            for lp, r, m in zip(old_lp, data.rollout_log_probs, data.loss_masks, strict=True)
        ]
        n = max(1.0, sum(float(sum(m)) for m in data.loss_masks))
        return {"train/train_rollout_logprob_abs_diff": float(sum(d.sum() for d in diffs)) / n}

    def update_weights(self, server_urls: list[str], version: int, transport: str, output_dir: str) -> float:
        """Push the current weights to every server (rank 0 sends; all ranks take part in the gather)."""
        start = time.monotonic()
        named = self.engine.export_hf_weights()
        if self.rank != 0:
            for _ in named:  # the gather across TP/PP ranks is collective
                pass
            return time.monotonic() - start
        if self.transport is None:
            self.transport = self._make_transport(server_urls, transport, output_dir)
        self.transport.send(named, version)
        return time.monotonic() - start

    def _make_transport(self, server_urls: list[str], kind: str, output_dir: str):
        if kind == "disk":
            from slime_like.weights.disk import DiskTransport

            return DiskTransport(
                server_urls,
                self.args.update_weight_buffer_size,
                self.args.hf_checkpoint,
                os.path.join(output_dir, "weights"),
            )
        from slime_like.weights.distributed import DistributedTransport

        return DistributedTransport(
            server_urls, self.args.update_weight_buffer_size, tp_per_server=self.args.rollout_num_gpus_per_engine
        )

    def save(self, directory: str) -> None:
        """Megatron distributed checkpoint of model, optimizer and RNG."""
        self.engine.save_checkpoint(directory)

    def load(self, directory: str) -> None:
        """Load a checkpoint written by `save`."""
        self.engine.load_checkpoint(directory)
