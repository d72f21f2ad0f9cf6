"""Example --eval-function-path: the built-in evaluation plus a majority-vote accuracy (maj@n) per dataset.

--eval-function-path plugins.majority_eval.evaluate_with_majority --n-samples-per-eval-prompt 4 --eval-temperature 0.7
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from buffer.data_source import PromptDataset
from rollout.context import RolloutContext
from rollout.evaluation import eval_sampling_params, evaluate_datasets
from rollout.rm_hub.boxed import last_boxed


async def evaluate_with_majority(
    ctx: RolloutContext, rollout_id: int, datasets: dict[str, PromptDataset]
) -> dict[str, Any]:
    """eval/<name>/reward_mean and pass@k as built in, plus eval/<name>/maj@n on boxed answers."""
    metrics, groups = await evaluate_datasets(ctx, datasets, eval_sampling_params(ctx.args))
    correct: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for group in groups:
        name = group[0].metadata["eval_dataset"]
        votes = Counter(a for a in (last_boxed(s.response) for s in group) if a is not None)
        total[name] += 1
        correct[name] += bool(votes) and votes.most_common(1)[0][0].strip() == str(group[0].label).strip()
    for name in total:
        metrics[f"eval/{name}/maj@{ctx.args.n_samples_per_eval_prompt}"] = correct[name] / total[name]
    return metrics
