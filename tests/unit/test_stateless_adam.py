"""slime's --use-stateless-adam: each step is Adam's first step from zero moments, and no state is kept."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from slime_like.arguments import parse_args
from slime_like.trainer.megatron.stateless_adam import StatelessAdam, make_stateless


def _param(value: list[float], grad: list[float]) -> torch.nn.Parameter:
    p = torch.nn.Parameter(torch.tensor(value))
    p.grad = torch.tensor(grad)
    return p


def test_a_step_by_hand() -> None:
    # lr 0.1, no decay: p -= 0.1 * g / (|g| + eps), i.e. 0.1 against the gradient's sign (0 for a zero gradient).
    p = _param([1.0, 1.0, 1.0], [0.5, -4.0, 0.0])
    StatelessAdam([p], lr=0.1, eps=1e-8).step()
    torch.testing.assert_close(p.detach(), torch.tensor([0.9, 1.1, 1.0]))
    # Decoupled decay 0.5 first: p * (1 - 0.1 * 0.5) = 0.95, then the step: 0.85.
    q = _param([1.0], [2.0])
    StatelessAdam([q], lr=0.1, weight_decay=0.5).step()
    torch.testing.assert_close(q.detach(), torch.tensor([0.85]))


def test_every_step_equals_adamw_from_fresh_moments() -> None:
    torch.manual_seed(0)
    ours = torch.nn.Parameter(torch.randn(5))
    theirs = torch.nn.Parameter(ours.detach().clone())
    stateless = StatelessAdam([ours], lr=0.01, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.1)
    for _ in range(3):
        grad = torch.randn(5)
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        stateless.step()
        torch.optim.AdamW([theirs], lr=0.01, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.1).step()  # fresh state
        torch.testing.assert_close(ours.detach(), theirs.detach())
    assert not stateless.state  # no moments kept


def test_megatrons_adam_is_swapped_over_the_same_groups() -> None:
    p = _param([1.0], [1.0])
    adam = torch.optim.AdamW([{"params": [p], "wd_mult": 1.0}], lr=0.1, weight_decay=0.0)
    group = adam.param_groups[0]
    part = SimpleNamespace(optimizer=adam, init_state_fn=lambda opt, config=None: None)
    assert make_stateless(SimpleNamespace(chained_optimizers=[part])) == 1
    assert isinstance(part.optimizer, StatelessAdam) and part.optimizer.param_groups[0] is group  # Megatron's keys
    assert group["wd_mult"] == 1.0 and group["lr"] == 0.1
    part.init_state_fn(part.optimizer)
    assert not part.optimizer.state
    with pytest.raises(ValueError, match="replaces Adam, not SGD"):
        make_stateless(SimpleNamespace(optimizer=torch.optim.SGD([p], lr=0.1)))


def test_the_flag(base: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_args(base + ["--use-stateless-adam", "--no-save-optim"]).use_stateless_adam is True
    with pytest.raises(SystemExit):
        parse_args(base + ["--use-stateless-adam"])
    assert "--use-stateless-adam needs --optimizer adam and --no-save-optim" in capsys.readouterr().err
