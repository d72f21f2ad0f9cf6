"""slime's --use-stateless-adam: Adam whose moments start from zero at every step, so none are kept.

With zero moments, one bias-corrected Adam step is m_hat = g, v_hat = g^2: the update is lr * g / (|g| + eps) (a
sign-like step), plus AdamW's decoupled weight decay. It equals resetting Adam's state before every step (slime's
StatelessAdam, slime/backends/megatron_utils/stateless_adam.py) and saves the two moment buffers per parameter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch


class StatelessAdam(torch.optim.Optimizer):
    """AdamW's step from zero moments, every step; it keeps no per-parameter state."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        bias_correction: bool = True,
        adam_w_mode: bool = True,
    ) -> None:
        if lr < 0.0 or eps < 0.0 or not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"StatelessAdam: invalid lr {lr}, eps {eps} or betas {betas}")
        defaults = dict(
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            bias_correction=bias_correction,
            adam_w_mode=adam_w_mode,
        )
        super().__init__(params, defaults)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The param groups of `state_dict`; any moments in it are dropped (there are none to keep)."""
        super().load_state_dict({**state_dict, "state": {}})

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update: p -= lr * g / (|g| * s + eps) * c, after decoupled (or L2) weight decay."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
            decay, adam_w = group["weight_decay"], group.get("adam_w_mode", True)
            # Without bias correction the zero-moment step is (1 - b1) g / (sqrt(1 - b2) |g| + eps).
            scale, denominator = (1.0, 1.0) if group.get("bias_correction", True) else (1 - beta1, math.sqrt(1 - beta2))
            for param in group["params"]:
                grad = param.grad
                if grad is None:
                    continue
                if decay != 0 and adam_w:
                    param.mul_(1.0 - lr * decay)
                elif decay != 0:
                    grad = grad.add(param, alpha=decay)
                param.addcdiv_(grad, grad.abs().mul(denominator).add_(eps), value=-lr * scale)
        return loss


def make_stateless(optimizer: Any) -> int:
    """Swap the Adam inside each of Megatron's (chained) optimizers for StatelessAdam, over the same param groups
    (their dicts, with Megatron's keys, are kept), and stop Megatron creating moments; returns how many it swapped."""
    swapped = 0
    for part in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        inner = getattr(part, "optimizer", None)
        if inner is None or isinstance(inner, StatelessAdam):
            continue
        if not isinstance(inner, torch.optim.Optimizer) or "betas" not in inner.defaults:
            raise ValueError(f"--use-stateless-adam replaces Adam, not {type(inner).__name__}")
        # The groups move over as they are: the distributed optimizer's hold shard views, which torch's
        # add_param_group refuses (not leaves); Adam took them at their making.
        fresh = StatelessAdam([torch.nn.Parameter(torch.zeros(0))], **_adam_defaults(inner))
        fresh.param_groups = inner.param_groups
        for group in fresh.param_groups:
            for key, value in fresh.defaults.items():
                group.setdefault(key, value)
        part.optimizer = fresh
        if getattr(part, "init_state_fn", None) is not None:
            part.init_state_fn = _no_state
        swapped += 1
    return swapped


def _adam_defaults(adam: torch.optim.Optimizer) -> dict[str, Any]:
    """StatelessAdam's arguments from an Adam's defaults (torch's Adam/AdamW, TE's or Apex's FusedAdam)."""
    defaults = adam.defaults
    keys = ("lr", "betas", "eps", "weight_decay", "bias_correction", "adam_w_mode")
    out = {k: defaults[k] for k in keys if k in defaults}
    if "adam_w_mode" not in defaults:  # torch's: AdamW decays decoupled, Adam adds the decay to the gradient
        out["adam_w_mode"] = isinstance(adam, torch.optim.AdamW) or bool(defaults.get("decoupled_weight_decay"))
    return out


def _no_state(optimizer: Any, config: Any = None) -> None:
    """Megatron's init_state_fn, made to create nothing (StatelessAdam keeps no moments)."""
