"""The training batch, from finished groups to the loss, and its split into one share per data-parallel rank.

TrainData is the one batch type of the data path: the rollout side builds it from samples (build_train_data),
shapes the rewards where every sample of a group is (buffer/group_rewards.py: the overlong penalty, the estimator's
group baseline), then splits it (split_by_dp): each trainer rank fetches only its own rows (tokens, masks,
log-probs, shaped rewards) and the rollout's size, with no per-sample list of the whole rollout (but each sample's
adapter in a multi-LoRA run). The trainer rank fills its share's trainer columns (old log-probs, advantages,
weights: slime_like/trainer/algorithms/rl_step.py), selects each optimizer step's and micro-batch's rows with
`select`, and hands those to the loss as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from slime_like.core.sample import Sample, Status, scalar_reward

if TYPE_CHECKING:  # torch is imported where tensors are made: argument parsing imports this module
    from torch import Tensor, device


@dataclass
class TrainData:
    """The training batch: one entry per sample in each column (a column nobody filled is empty)."""

    tokens: list[list[int]] = field(default_factory=list)
    response_lengths: list[int] = field(default_factory=list)
    loss_masks: list[list[int]] = field(default_factory=list)
    raw_rewards: list[float] = field(default_factory=list)  # the task reward as scored
    group_ids: list[int] = field(default_factory=list)  # samples of one prompt share an id
    rollout_log_probs: list[list[float] | None] = field(default_factory=list)  # None: SGLang gave none
    sample_indices: list[int] = field(default_factory=list)
    weight_versions: list[int | None] = field(default_factory=list)
    # True where a slime reward post-process already normalised the reward: the estimator takes it as it is.
    # Empty (as in data built by hand) means False everywhere.
    reward_normalized: list[bool] = field(default_factory=list)
    # R3 (--use-rollout-routing-replay): SGLang's routed experts, [len(tokens) - 1, layers, topk] int32 per sample
    # (slime's rollout_routed_experts); None where SGLang returned none. Empty when no sample has them.
    rollout_routed_experts: list[Any] = field(default_factory=list)
    # --use-opd: the teacher's log-prob of each response token (slime's teacher_log_probs). Empty when none has them.
    teacher_log_probs: list[list[float] | None] = field(default_factory=list)
    # Multi-LoRA (--multi-lora-adapter): the adapter each sample was generated with and trains. Empty in other runs.
    lora_adapters: list[str | None] = field(default_factory=list)
    # Vision-language samples: the processor's tensors of each sample's images (slime's multimodal_train_inputs:
    # pixel_values, image_grid_thw), None for a text sample. Empty when no sample has images.
    multimodal_train_inputs: list[dict[str, Any] | None] = field(default_factory=list)
    # Filled on the rollout side, where whole groups are (buffer.group_rewards.shape_rewards); empty until then.
    rewards: list[float] = field(default_factory=list)  # raw reward plus DAPO's overlong penalty
    baselined_rewards: list[float] = field(default_factory=list)  # rewards after the estimator's group baseline
    # Filled on the trainer rank for its share (rl_step.py), one float tensor per sample over its response tokens;
    # empty until then and where the run has no such term.
    old_log_probs: list[Tensor] = field(default_factory=list)  # the old policy's (SGLang's: --use-rollout-logprobs)
    advantages: list[Tensor] = field(default_factory=list)
    ref_log_probs: list[Tensor] = field(default_factory=list)  # a KL term is on
    is_weights: list[Tensor] = field(default_factory=list)  # an off-policy correction is on
    old_values: list[Tensor] = field(default_factory=list)  # ppo: the critic's values
    returns: list[Tensor] = field(default_factory=list)  # ppo: the critic's targets
    entropy: list[Tensor] = field(default_factory=list)  # --use-rollout-entropy: the old policy's, per token
    # Set per optimizer step: the coefficients of --loss-agg-mode (times the loss mask) and of token-mean metrics.
    token_weights: list[Tensor] = field(default_factory=list)
    metric_weights: list[Tensor] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def select(self, indices: list[int]) -> TrainData:
        """The rows at `indices`, in that order."""
        return TrainData(**{f.name: _take(getattr(self, f.name), indices) for f in fields(self)})

    def masks(self, where: device | None = None) -> list[Tensor]:
        """The loss masks as float tensors (on `where`, default the CPU)."""
        import torch

        return [torch.as_tensor(m, dtype=torch.float32, device=where) for m in self.loss_masks]

    def to(self, where: device) -> TrainData:
        """This batch with its tensor columns on `where` (the trainer makes them on the CPU)."""
        import torch

        if torch.device(where).type == "cpu":
            return self
        moved = {
            f.name: [t.to(where, non_blocking=True) for t in column]
            for f in fields(self)
            if (column := getattr(self, f.name)) and torch.is_tensor(column[0])
        }
        return replace(self, **moved)

    def num_tokens(self) -> int:
        """Total tokens (prompt + response) over all rows."""
        return sum(len(t) for t in self.tokens)


def _take(column: list[Any], indices: list[int]) -> list[Any]:
    return [column[i] for i in indices] if column else []


@dataclass
class RolloutSummary:
    """What a rank knows of the whole rollout beyond its own rows. Sums over the rollout (whitening, loss counts,
    metrics, checks) are one all-reduce of one number per sample, each rank filling its own rows."""

    size: int  # samples in the rollout: the length of the vectors the DP collectives add up
    rewards_normalized: bool = False  # a slime reward post-process normalised every sample's reward
    lora_adapters: list[str | None] = field(default_factory=list)  # multi-LoRA: each sample's adapter, else empty

    def __len__(self) -> int:
        return self.size


@dataclass
class RankShare:
    """One data-parallel rank's rows of a rollout: its own per-sample data and what it knows of the rollout."""

    data: TrainData  # this rank's rows, in rollout order
    rows: list[int]  # their positions in the rollout
    steps: list[list[int]]  # per optimizer step, the indices into `data` of this rank's rows of that step
    step_bounds: list[tuple[int, int]]  # per optimizer step, its [begin, end) rows of the rollout
    rollout: RolloutSummary
    dp_rank: int = 0
    dp_size: int = 1

    def __len__(self) -> int:
        return len(self.data)


def balanced_split(lengths: list[int], parts: int) -> list[list[int]]:
    """Deterministic token-balanced partition of indices into `parts` (each in input order).

    Longest first, each to the part with the fewest tokens so far (ties: fewest sequences, lowest part).
    With fewer sequences than parts some are empty.
    """
    shares: list[list[int]] = [[] for _ in range(parts)]
    tokens = [0] * parts
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        part = min(range(parts), key=lambda r: (tokens[r], len(shares[r]), r))
        shares[part].append(i)
        tokens[part] += lengths[i]
    return [sorted(s) for s in shares]


def rewards_normalized(data: TrainData) -> bool:
    """Whether a slime reward post-process normalised every sample's reward (the estimator takes them as they are)."""
    return bool(data.reward_normalized) and all(data.reward_normalized)


def rollout_summary(data: TrainData) -> RolloutSummary:
    """What every rank of `data`'s split knows of it."""
    return RolloutSummary(len(data), rewards_normalized(data), list(data.lora_adapters))


def split_by_dp(data: TrainData, dp_size: int, global_batch_size: int, multiple: int = 1) -> list[RankShare]:
    """One share per data-parallel rank: each optimizer step (`global_batch_size` consecutive rows) is split
    token-balanced over the ranks, lengths rounded up to `multiple` (the padding the trainer's layout adds)."""
    if dp_size < 1 or global_batch_size < 1:
        raise ValueError(f"split_by_dp: dp_size {dp_size} and global_batch_size {global_batch_size} must be >= 1")
    summary = rollout_summary(data)
    mine: list[list[int]] = [[] for _ in range(dp_size)]  # rollout rows of each rank
    steps: list[list[list[int]]] = [[] for _ in range(dp_size)]
    bounds = [(b, min(b + global_batch_size, len(data))) for b in range(0, len(data), global_batch_size)]
    for begin, end in bounds:
        lengths = [-(-len(data.tokens[i]) // multiple) * multiple for i in range(begin, end)]
        for rank, part in enumerate(balanced_split(lengths, dp_size)):
            steps[rank].append(list(range(len(mine[rank]), len(mine[rank]) + len(part))))
            mine[rank].extend(begin + i for i in part)
    return [
        RankShare(data.select(mine[r]), mine[r], steps[r], bounds, summary, dp_rank=r, dp_size=dp_size)
        for r in range(dp_size)
    ]


def trainable(sample: Sample) -> bool:
    """Whether a sample trains: not failed or aborted (no usable reward) and with at least one response token."""
    return sample.status not in (Status.FAILED, Status.ABORTED) and sample.response_length > 0


def build_train_data(groups: list[list[Sample]], *, reward_key: str | None = None) -> TrainData:
    """Collect the columns the trainer needs; the rewards are shaped next (buffer.group_rewards.shape_rewards).

    Failed samples (generation or reward function failed) and aborted ones carry no usable reward:
    they are left out, so they neither take part in their group's statistics nor get trained on.
    """
    data = TrainData()
    for group_id, group in enumerate(groups):
        usable = [s for s in group if trainable(s)]
        for sample in usable:
            mask = sample.loss_mask if sample.loss_mask is not None else [1] * sample.response_length
            if len(mask) != sample.response_length:
                raise ValueError(
                    f"sample {sample.index}: loss_mask has {len(mask)} entries for {sample.response_length} response tokens"
                )
            logprobs = sample.rollout_log_probs
            if logprobs is not None and len(logprobs) != sample.response_length:
                raise ValueError(
                    f"sample {sample.index}: {len(logprobs)} rollout log-probs for {sample.response_length} response tokens"
                )
            data.tokens.append(list(sample.tokens))
            data.response_lengths.append(sample.response_length)
            data.loss_masks.append(list(mask))
            data.raw_rewards.append(scalar_reward(sample, reward_key))
            data.group_ids.append(group_id)
            data.rollout_log_probs.append(None if logprobs is None else list(logprobs))
            data.sample_indices.append(sample.index)
            data.weight_versions.append(sample.weight_version)
            data.reward_normalized.append(bool(sample.metadata.get("reward_normalized")))
            data.rollout_routed_experts.append(_routed_experts(sample))
            data.teacher_log_probs.append(_teacher_log_probs(sample))
            data.lora_adapters.append(sample.metadata.get("lora_adapter"))  # rollout/lora_data.py's ADAPTER_KEY
            data.multimodal_train_inputs.append(getattr(sample, "multimodal_train_inputs", None) or None)
    for column in ("rollout_routed_experts", "teacher_log_probs", "lora_adapters", "multimodal_train_inputs"):
        if not any(r is not None for r in getattr(data, column)):
            setattr(data, column, [])  # no R3 / no teacher / no images: no column to carry
    return data


def _teacher_log_probs(sample: Sample) -> list[float] | None:
    """The teacher's log-probs of the response tokens, checked to cover each one (None if the sample has none)."""
    teacher = sample.teacher_log_probs
    if teacher is None:
        return None
    teacher = [float(x) for x in (teacher.tolist() if hasattr(teacher, "tolist") else teacher)]
    if len(teacher) != sample.response_length:
        raise ValueError(
            f"sample {sample.index}: {len(teacher)} teacher log-probs for {sample.response_length} response tokens"
        )
    return teacher


def _routed_experts(sample: Sample) -> Any:
    """The sample's routed experts as an int32 array, checked to cover every token but the last (None if none)."""
    if sample.rollout_routed_experts is None:
        return None
    import numpy as np

    experts = np.asarray(sample.rollout_routed_experts, dtype=np.int32)
    if experts.ndim != 3 or experts.shape[0] != len(sample.tokens) - 1:
        raise ValueError(
            f"sample {sample.index}: rollout_routed_experts has shape {experts.shape}, but {len(sample.tokens)} tokens "
            f"need [{len(sample.tokens) - 1}, layers, topk] (every token but the last; tokens appended after the "
            "last /generate, e.g. a tool's, have no routing)"
        )
    return experts
