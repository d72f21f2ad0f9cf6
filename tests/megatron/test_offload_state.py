"""--offload-train creates Adam's moments inside the offload region at build time: training must not notice."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.megatron.common import fixed_batch, num_targets, token_ce_loss


def _inner(engine) -> list[torch.optim.Optimizer]:
    return [part.optimizer for part in getattr(engine.optimizer, "chained_optimizers", [engine.optimizer])]


def _states(engine) -> list[dict[str, torch.Tensor]]:
    return [dict(opt.state[p]) for opt in _inner(engine) for g in opt.param_groups for p in g["params"]]


@pytest.mark.parametrize(("dtype", "distributed"), [(torch.float32, True), (torch.bfloat16, False)])
def test_materialized_state_trains_bit_identically(
    tiny_qwen3: Path, megatron_world: None, dtype: torch.dtype, distributed: bool
) -> None:
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.offload import materialize_optimizer_state
    from slime_like.trainer.megatron.optimizer import OptimizerSettings

    settings = OptimizerSettings(lr=1e-3, weight_decay=0.01, use_distributed_optimizer=distributed)
    lazy, eager = (MegatronTrainEngine(tiny_qwen3, settings, max_tokens_per_micro_batch=40, dtype=dtype) for _ in "ab")
    assert all(not s for s in _states(eager))  # torch's Adam creates its state at the first step
    params = sum(len(g["params"]) for opt in _inner(eager) for g in opt.param_groups)
    assert materialize_optimizer_state(eager.optimizer) == params
    assert materialize_optimizer_state(eager.optimizer) == 0  # idempotent
    for state in _states(eager):
        assert float(state["step"]) == 0.0
        assert not state["exp_avg"].any() and not state["exp_avg_sq"].any()

    seqs = fixed_batch()
    loss = token_ce_loss(num_targets(seqs))
    for _ in range(2):
        a = lazy.train_step(seqs, [None] * len(seqs), loss)
        b = eager.train_step(seqs, [None] * len(seqs), loss)
        assert a == b
    # One export at a time: interleaving two of them would interleave their no_grad contexts.
    lazy_weights = {name: t.clone() for name, t in lazy.export_hf_weights()}
    eager_weights = {name: t.clone() for name, t in eager.export_hf_weights()}
    assert lazy_weights.keys() == eager_weights.keys()
    assert all(torch.equal(lazy_weights[n], eager_weights[n]) for n in lazy_weights)
    for x, y in zip(_states(lazy), _states(eager), strict=True):
        assert x.keys() == y.keys()
        assert all(torch.equal(x[k], y[k]) for k in x)
        assert float(x["step"]) == 2.0
