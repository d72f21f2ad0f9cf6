"""Evaluation over one or more datasets: mean reward and pass@k per dataset (k = 1, 2, 4, ... up to n)."""

from __future__ import annotations

import asyncio
import math
import statistics
from typing import Any

from buffer.data_source import DataSource, PromptDataset
from rollout.context import RolloutContext
from rollout.generate import sampling_params_from_args
from rollout.group import run_group
from rollout.sglang_client import LORA_ADAPTER_KEY
from rollout.slime_arguments import eval_reward_key
from slime_like.core.sample import Sample, Status, scalar_reward


def eval_sampling_params(args: Any) -> dict[str, Any]:
    """The eval sampling parameters: the rollout's, with the `--eval-*` overrides."""
    params = sampling_params_from_args(args)
    for name in ("temperature", "top_p", "top_k"):
        value = getattr(args, f"eval_{name}")
        if value is not None:  # else the rollout's own, as sampling_params_from_args set it
            params[name] = value
    if args.eval_max_response_len:
        params["max_new_tokens"] = args.eval_max_response_len
    if getattr(args, "eval_min_new_tokens", None) is not None:
        params["min_new_tokens"] = args.eval_min_new_tokens
    return params


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021, "Evaluating LLMs trained on code")."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def ks_for(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself."""
    return sorted({2**i for i in range(int(math.log2(n)) + 1)} | {n})


def dataset_metrics(name: str, groups: list[list[Sample]], args: Any) -> dict[str, float]:
    """eval/<name>/reward_mean, pass@k, response length and truncation for one dataset."""
    samples = [s for g in groups for s in g]
    reward_key = eval_reward_key(args)
    rewards = [scalar_reward(s, reward_key) for s in samples]
    n = args.n_samples_per_eval_prompt
    metrics = {
        f"eval/{name}/reward_mean": statistics.fmean(rewards),
        f"eval/{name}/num_samples": len(samples),
        f"eval/{name}/response_len_mean": statistics.fmean(s.response_length for s in samples),
        f"eval/{name}/truncated_rate": sum(s.status == Status.TRUNCATED for s in samples) / len(samples),
        f"eval/{name}/failed_rate": sum(s.status == Status.FAILED for s in samples) / len(samples),
    }
    for k in ks_for(n):
        per_prompt = [
            pass_at_k(len(g), sum(scalar_reward(s, reward_key) >= args.eval_pass_threshold for s in g), k)
            for g in groups
        ]
        metrics[f"eval/{name}/pass@{k}"] = statistics.fmean(per_prompt)
    return metrics


async def evaluate_datasets(
    ctx: RolloutContext, datasets: dict[str, PromptDataset], params: dict[str, Any]
) -> tuple[dict[str, float], list[list[Sample]]]:
    """Generate and score every prompt of every dataset `--n-samples-per-eval-prompt` times; metrics and groups."""
    by_name = {
        name: DataSource(ds, ctx.args.n_samples_per_eval_prompt, shuffle=False).get_groups(len(ds))
        for name, ds in datasets.items()
    }
    adapter = getattr(ctx.args, "multi_lora_eval_adapter", None)  # multi-LoRA: the adapter that evaluates
    for name, groups in by_name.items():
        for sample in (s for g in groups for s in g):
            sample.metadata["eval_dataset"] = name
            if adapter:  # the built-in generate sends it as the request's lora_path, as for training samples
                sample.metadata[LORA_ADAPTER_KEY] = adapter
    every = [g for groups in by_name.values() for g in groups]
    await asyncio.gather(*(run_group(ctx, g, params) for g in every))
    metrics: dict[str, float] = {}
    for name, groups in by_name.items():
        metrics.update(dataset_metrics(name, groups, ctx.args))
    rewards = [scalar_reward(s, eval_reward_key(ctx.args)) for g in every for s in g]
    metrics["eval/reward_mean"] = statistics.fmean(rewards)  # over every dataset's samples
    return metrics, every
