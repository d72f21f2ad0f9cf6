"""One adapter's part of a multi-LoRA rollout share: the rows, steps and rollout summary of its samples only,
renumbered as if the rollout held nothing else, so that the trainer's usual step (advantages, loss normalisation,
metrics) sees each adapter's samples alone."""

from __future__ import annotations

from buffer.train_data import RankShare, RolloutSummary


def adapter_names(share: RankShare) -> list[str]:
    """The adapters a rollout's samples name, in order of first appearance (the same on every rank)."""
    return list(dict.fromkeys(a for a in share.rollout.lora_adapters if a is not None))


def adapter_share(share: RankShare, name: str) -> RankShare:
    """The rows of `share` whose sample trains adapter `name`; optimizer steps without one of its samples (on any
    rank) are dropped, the others keep their boundaries within the adapter's samples."""
    whole = share.rollout.lora_adapters
    if len(whole) != len(share.rollout):
        raise ValueError("adapter_share: the rollout has no lora_adapters column (not a multi-LoRA rollout)")
    keep = [i for i, a in enumerate(whole) if a == name]
    position = {row: new for new, row in enumerate(keep)}
    scalars = RolloutSummary(len(keep), share.rollout.rewards_normalized, [whole[i] for i in keep])
    mine = [j for j, row in enumerate(share.rows) if row in position]
    index = {j: new for new, j in enumerate(mine)}  # share.data index -> adapter share index
    steps, bounds = [], []
    for (begin, end), step in zip(share.step_bounds, share.steps, strict=True):
        new_begin = sum(1 for row in keep if row < begin)
        new_end = sum(1 for row in keep if row < end)
        if new_end > new_begin:  # the adapter has samples in this step
            steps.append([index[j] for j in step if j in index])
            bounds.append((new_begin, new_end))
    return RankShare(
        share.data.select(mine), [position[share.rows[j]] for j in mine], steps, bounds, scalars,
        dp_rank=share.dp_rank, dp_size=share.dp_size,
    )  # fmt: skip
