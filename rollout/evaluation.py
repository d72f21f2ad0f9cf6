"""Evaluation over one or more datasets: mean reward and pass@k per dataset (k = 1, 2, 4, ... up to n)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import statistics
from typing import Any

from buffer.arguments import multimodal_dataset_kwargs
from buffer.data_source import DataSource, PromptDataset
from rollout.context import RolloutContext, running
from rollout.eval_config import EvalDatasetConfig, dataset_configs
from rollout.eval_hooks import all_dataset_hooks, close_dataset_hooks
from rollout.generate import sampling_params_from_args
from rollout.group import run_group
from rollout.hooks import RolloutHooks
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


def load_eval_dataset(args: Any, config: EvalDatasetConfig, tokenizer: Any) -> PromptDataset:
    """An eval dataset's rows, read with its keys and chat-template options (rollout/eval_config.py)."""
    return PromptDataset(
        config.path,
        input_key=config.input_key or args.input_key,
        label_key=config.label_key,
        metadata_key=config.metadata_key,
        tool_key=config.tool_key,
        tokenizer=tokenizer,
        apply_chat_template=bool(config.apply_chat_template),
        chat_template_kwargs=config.apply_chat_template_kwargs,
        max_prompt_len=_max_prompt_len(args),
        skip_bad_rows=args.skip_bad_rows,
        **multimodal_dataset_kwargs(args, config.multimodal_keys),  # its own keys, else --multimodal-keys (slime)
    )


def _max_prompt_len(args: Any) -> int | None:
    """Longer eval prompts are skipped: --eval-max-prompt-len if given, else --rollout-max-prompt-len."""
    eval_len = getattr(args, "eval_max_prompt_len", None)
    return eval_len if eval_len is not None else args.rollout_max_prompt_len


def dataset_metrics(name: str, groups: list[list[Sample]], args: Any, n: int | None = None) -> dict[str, float]:
    """eval/<name>/reward_mean, pass@k (k up to n samples per prompt), response length and truncation."""
    samples = [s for g in groups for s in g]
    key = eval_reward_key(args)
    rewards = [scalar_reward(s, key) for s in samples]
    n = n or args.n_samples_per_eval_prompt
    metrics = {
        f"eval/{name}/reward_mean": statistics.fmean(rewards),
        f"eval/{name}/num_samples": len(samples),
        f"eval/{name}/response_len_mean": statistics.fmean(s.response_length for s in samples),
        f"eval/{name}/truncated_rate": sum(s.status == Status.TRUNCATED for s in samples) / len(samples),
        f"eval/{name}/failed_rate": sum(s.status == Status.FAILED for s in samples) / len(samples),
    }
    for k in ks_for(n):
        per_prompt = [
            pass_at_k(len(g), sum(scalar_reward(s, key) >= args.eval_pass_threshold for s in g), k) for g in groups
        ]
        metrics[f"eval/{name}/pass@{k}"] = statistics.fmean(per_prompt)
    return metrics


def _prepare(ctx: RolloutContext, name: str, groups: list[list[Sample]], config: EvalDatasetConfig | None) -> None:
    """Tag each sample with its dataset (and the eval's LoRA adapter) and apply the dataset's metadata fields."""
    adapter = getattr(ctx.args, "multi_lora_eval_adapter", None)  # multi-LoRA: the adapter that evaluates
    for sample in (s for g in groups for s in g):
        if config is not None:
            sample.metadata = config.inject_metadata(sample.metadata)
            if hasattr(sample, "custom_rm_path"):  # slime's Sample: its fields as slime's eval sets them
                sample.custom_rm_path = config.custom_rm_path
                sample.generate_function_path = config.custom_generate_function_path
        sample.metadata["eval_dataset"] = name
        if adapter:  # the built-in generate sends it as the request's lora_path, as for training samples
            sample.metadata[LORA_ADAPTER_KEY] = adapter


async def evaluate_datasets(
    ctx: RolloutContext,
    datasets: dict[str, PromptDataset],
    params: dict[str, Any],
    hooks: dict[str, RolloutHooks] | None = None,
) -> tuple[dict[str, float], list[list[Sample]]]:
    """Generate and score every prompt of every dataset n times (its n_samples_per_eval_prompt), with its sampling
    parameters over `params` and its generate and reward functions (`hooks`: made for this call when None)."""
    configs = {c.name: c for c in dataset_configs(ctx.args)}
    own = hooks
    if own is None:
        used = [configs[name] for name in datasets if name in configs]
        own = all_dataset_hooks(ctx.args, ctx.hooks, used) if ctx.hooks is not None else {}
    by_name: dict[str, list[list[Sample]]] = {}
    tasks = []
    try:
        for name, ds in datasets.items():
            config = configs.get(name)
            n = (config.n_samples_per_eval_prompt if config else None) or ctx.args.n_samples_per_eval_prompt
            by_name[name] = DataSource(ds, n, shuffle=False).get_groups(len(ds))
            _prepare(ctx, name, by_name[name], config)
            dataset_ctx = dataclasses.replace(ctx, hooks=own[name]) if name in own else ctx
            dataset_params = config.sampling_params(params) if config else params
            with running(dataset_ctx):  # its tasks see it as the current context (slime's rm_hub reads it)
                tasks += [asyncio.ensure_future(run_group(dataset_ctx, g, dataset_params)) for g in by_name[name]]
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:  # nothing of this eval runs on after it failed (or was cancelled)
            task.cancel()
        raise
    finally:
        if hooks is None and ctx.hooks is not None:
            await close_dataset_hooks(ctx.hooks, own)
    metrics: dict[str, float] = {}
    for name, groups in by_name.items():
        config = configs.get(name)
        metrics.update(dataset_metrics(name, groups, ctx.args, config.n_samples_per_eval_prompt if config else None))
    every = [g for groups in by_name.values() for g in groups]
    key = eval_reward_key(ctx.args)
    metrics["eval/reward_mean"] = statistics.fmean(scalar_reward(s, key) for g in every for s in g)  # every dataset
    return metrics, every
