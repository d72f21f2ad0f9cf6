"""Custom loss and advantage hooks written for slime, run by our trainer (docs/plugins.md, "Plugins written for slime").

slime calls a custom loss as `fn(args, batch, logits, sum_of_sample_mean) -> (loss, metrics)` and a custom
advantage estimator as `fn(args, rollout_data) -> None`, which sets `rollout_data["advantages"]` and
`["returns"]`. Its TIS function (--custom-tis-function-path) and pg-loss reducer
(--custom-pg-loss-reducer-function-path) run inside our policy loss (slime_tis, slime_pg_reducer). Each is
wrapped once, when step_hooks.py loads it, into our contract; the adapters build slime's arguments from ours at
the call boundary (slime's per-sample keys: slime_lists.py):

- Our engine hands a loss per-token log-probs and entropies of the responses, not the [1, T, V] logits. The
  `logits` a slime loss gets is a `ResponseLogits`, which `get_log_probs_and_entropy` (also importable as
  `slime.backends.megatron_utils.loss.get_log_probs_and_entropy`) turns into them; any other use of the
  logits raises an error that says so.
- `sum_of_sample_mean(x)` sums x (the batch's response tokens, concatenated) weighted by our --loss-agg-mode
  coefficients, so the loss is the micro-batch's share of the step objective as our engine expects (with
  the default seq-mean-token-mean it is slime's per-sample mean over the global batch).
- `rollout_data["rewards"]` are slime's normalised rewards (the group mean removed, divided by the group's
  std for grpo/gspo/cispo unless --disable-grpo-std-normalization; as they are with
  --disable-rewards-normalization), or those a slime reward post-process returned; `raw_reward` holds the task
  rewards. `kl` is slime's: log pi_old vs the reference by
  --kl-loss-type when --kl-coef is set, else zeros.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from buffer.train_data import TrainData
from rollout.slime_contract import slime_args
from slime_like.core.plugin_loader import load_plugin
from slime_like.trainer.algorithms.advantages import AdvantageInputs, Advantages
from slime_like.trainer.algorithms.grpo import grpo_advantages
from slime_like.trainer.algorithms.kl import kl_estimate
from slime_like.trainer.algorithms.slime_lists import slime_lists

# Estimators whose rewards slime normalises per group before the estimator runs (rewards_normalization).
NORMALISED = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")


class ResponseLogits:
    """Stands in for slime's logits: the responses' per-token log-probs and entropies (with their graphs)."""

    def __init__(self, log_probs: list[torch.Tensor], entropy: list[torch.Tensor] | None) -> None:
        self.log_probs = log_probs
        self.entropy = entropy

    @property
    def device(self) -> torch.device:
        """The device the log-probs are on."""
        return self.log_probs[0].device

    @property
    def dtype(self) -> torch.dtype:
        """float32, as slime asserts."""
        return torch.float32

    def sum(self) -> torch.Tensor:
        """A zero that keeps the graph (slime losses add `0 * logits.sum()` so every rank backpropagates)."""
        return sum((lp.sum() for lp in self.log_probs), self.log_probs[0].new_zeros(())) * 0.0

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"logits.{name}: slime_like hands custom losses the responses' log-probs and entropies, not the "
            "vocabulary logits; get them with slime.backends.megatron_utils.loss.get_log_probs_and_entropy(logits, ...)"
        )


def get_log_probs_and_entropy(
    logits: ResponseLogits, *, with_entropy: bool = False, **_: Any
) -> tuple[torch.Tensor, dict[str, list[torch.Tensor]]]:
    """slime's helper on our stand-in: (empty tensor, {"log_probs": [...], "entropy": [...]}) per response."""
    if not isinstance(logits, ResponseLogits):
        raise TypeError("get_log_probs_and_entropy takes the `logits` a custom loss was handed by slime_like")
    out = {"log_probs": list(logits.log_probs)}
    if with_entropy:
        if logits.entropy is None:
            raise ValueError("the engine computed no entropies for this loss")
        out["entropy"] = list(logits.entropy)
    return logits.log_probs[0].new_empty((0,)), out


def slime_batch(micro: TrainData, device: torch.device | None = None) -> dict[str, Any]:
    """slime's `batch` for a loss: one entry per sample of the micro-batch, its tensors on `device`."""
    batch = slime_lists(micro, device)
    batch["unconcat_tokens"] = batch["tokens"]
    batch["rollout_mask_sums"] = [m.sum() for m in batch["loss_masks"]]
    batch.setdefault("returns", batch["advantages"])  # slime's returns are the advantages without a critic
    return batch


def slime_loss_fn(args: Any, fn: Callable[..., Any]) -> Callable[..., tuple[torch.Tensor, dict[str, float]]]:
    """Our engine's loss function around a slime custom loss (--custom-loss-function-path)."""
    view = slime_args(args)

    def loss_fn(log_probs: list[torch.Tensor], micro: TrainData, entropy: list[torch.Tensor] | None = None):
        lengths = micro.response_lengths
        resp = [lp[-n:] for lp, n in zip(log_probs, lengths, strict=True)]
        ents = None if entropy is None else [e[-n:] for e, n in zip(entropy, lengths, strict=True)]
        weights = torch.cat(micro.token_weights)

        def sum_of_sample_mean(x: torch.Tensor) -> torch.Tensor:
            return (x * weights).sum()

        loss, metrics = fn(view, slime_batch(micro, weights.device), ResponseLogits(resp, ents), sum_of_sample_mean)
        return loss, {k: float(torch.as_tensor(v).detach()) for k, v in metrics.items()}

    return loss_fn


def slime_tis(args: Any, fn: Callable[..., Any]) -> Callable[..., tuple[torch.Tensor, torch.Tensor, dict[str, Any]]]:
    """A slime TIS function (--custom-tis-function-path) as `(pg_loss, micro) -> (pg_loss, kept, metrics)`.

    slime calls it as fn(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths,
    response_lengths) with pg_loss the micro-batch's per-token loss (responses concatenated) and per-sample
    lists for the rest; it returns (pg_loss, loss_masks, metrics), its masks zeroing rejected tokens and its
    metrics per-token tensors. `kept` is those masks concatenated: rejected tokens leave the loss but keep
    their place in its normaliser, as in slime.
    """
    view = slime_args(args)

    def apply(pg_loss: torch.Tensor, micro: TrainData) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        device = pg_loss.device
        pg_loss, masks, metrics = fn(
            view,
            pg_loss=pg_loss,
            train_log_probs=list(micro.old_log_probs),
            rollout_log_probs=[torch.as_tensor(r, dtype=torch.float32, device=device) for r in micro.rollout_log_probs],
            loss_masks=micro.masks(device),
            total_lengths=[len(t) for t in micro.tokens],
            response_lengths=list(micro.response_lengths),
        )
        return pg_loss, torch.cat([torch.as_tensor(m, dtype=torch.float32) for m in masks]), dict(metrics or {})

    return apply


def slime_pg_reducer(args: Any, fn: Callable[..., Any]) -> Callable[..., torch.Tensor]:
    """A slime pg-loss reducer factory (--custom-pg-loss-reducer-function-path) as
    `(pg_loss, micro, masks, token_weight) -> the micro-batch's share of the step's policy-gradient loss`.

    slime calls fn(total_lengths, response_lengths, loss_masks, calculate_per_token_loss) and applies the
    reducer it returns to the concatenated per-token pg loss, in place of its per-sample token mean summed over
    the micro-batch; slime then divides by the step's samples (or, per-token, by its loss tokens). Both
    divisors are read off the step's aggregation weights: sum_t c_it = 1/B for seq-mean-token-mean, c = 1/N
    for token-mean.
    """

    def reduce(
        pg_loss: torch.Tensor, micro: TrainData, masks: list[torch.Tensor], token_weight: torch.Tensor
    ) -> torch.Tensor:
        lengths = list(micro.response_lengths)
        reducer = fn([len(t) for t in micro.tokens], lengths, masks, bool(args.calculate_per_token_loss))
        per_row = [w.sum() for w in token_weight.split(lengths)]
        scale = float(token_weight.max()) if args.loss_agg_mode == "token-mean" else float(max(per_row))
        return reducer(pg_loss) * scale

    return reduce


def slime_rewards(args: Any, inputs: AdvantageInputs) -> list[float]:
    """The rewards slime hands its advantage code: normalised per group for grpo-like estimators."""
    name = args.advantage_estimator
    if inputs.rewards_normalized or name not in NORMALISED or not getattr(args, "rewards_normalization", True):
        return list(inputs.rewards)
    use_std = name != "reinforce_plus_plus_baseline" and not args.disable_grpo_std_normalization
    return grpo_advantages(inputs.rewards, inputs.group_ids, use_std)


def slime_advantage_hook(fn: Callable[..., Any]) -> Callable[[Any, AdvantageInputs], Advantages]:
    """A slime custom advantage function (--custom-advantage-function-path) in our contract `(args, inputs)`."""
    return lambda args, inputs: slime_advantages(args, inputs, fn, inputs.tokens)


def slime_pg_hooks(args: Any) -> tuple[Callable[..., Any] | None, Callable[..., Any] | None]:
    """slime's --custom-tis-function-path and --custom-pg-loss-reducer-function-path, loaded and adapted (None
    when unset)."""
    tis_path = getattr(args, "custom_tis_function_path", None)
    reducer_path = getattr(args, "custom_pg_loss_reducer_function_path", None)
    tis = slime_tis(args, load_plugin(tis_path, "--custom-tis-function-path")) if tis_path else None
    reducer = (
        slime_pg_reducer(args, load_plugin(reducer_path, "--custom-pg-loss-reducer-function-path"))
        if reducer_path
        else None
    )
    return tis, reducer


def slime_advantages(
    args: Any, inputs: AdvantageInputs, fn: Callable[..., Any], tokens: list[list[int]] | None
) -> Advantages:
    """Run a slime custom advantage function on slime's `rollout_data`; its advantages (and returns)."""
    if tokens is None:
        raise ValueError("a slime advantage function reads the samples' tokens: AdvantageInputs.tokens is unset")
    lp = inputs.log_probs
    if args.use_rollout_logprobs and inputs.rollout_log_probs and all(r is not None for r in inputs.rollout_log_probs):
        lp = list(inputs.rollout_log_probs)  # type: ignore[arg-type]
    if args.kl_coef and inputs.ref_log_probs is not None:
        kl = [kl_estimate(a, b, args.kl_loss_type) for a, b in zip(lp, inputs.ref_log_probs, strict=True)]
    else:
        kl = [torch.zeros_like(x, dtype=torch.float32) for x in lp]
    rollout_data: dict[str, Any] = {
        "tokens": [torch.tensor(t) for t in tokens],
        "total_lengths": [len(t) for t in tokens],
        "response_lengths": [len(m) for m in inputs.loss_masks],
        "loss_masks": inputs.loss_masks,
        "rewards": slime_rewards(args, inputs),
        "raw_reward": list(inputs.rewards),
        "log_probs": lp,
        "kl": kl,
    }
    for key in ("ref_log_probs", "rollout_log_probs", "values"):
        if getattr(inputs, key) is not None:
            rollout_data[key] = getattr(inputs, key)
    fn(slime_args(args), rollout_data)
    if "advantages" not in rollout_data:
        raise ValueError("--custom-advantage-function-path (slime's contract) must set rollout_data['advantages']")
    returns = rollout_data.get("returns")
    return Advantages(list(rollout_data["advantages"]), None if returns is None else list(returns))
