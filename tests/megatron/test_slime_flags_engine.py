"""Dropout and --optimizer sgd reach the real Megatron model and optimizer; on CPU recompute stays off; slime's
TIS hook, --get-mismatch-metrics, --use-opsm and --use-unbiased-kl run in a real trainer step."""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

import pytest
import torch

from slime_like.trainer.megatron.flags import model_config_overrides, optimizer_settings


def test_flags_reach_megatron(tiny_qwen3: Path, megatron_world: None) -> None:
    from megatron.core.utils import get_model_config

    from slime_like.trainer.megatron.engine import MegatronTrainEngine

    args = Namespace(
        recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1, recompute_modules=None,
        hidden_dropout=0.0, attention_dropout=0.0, attention_softmax_in_fp32=False, attention_backend="flash",
        deterministic_mode=False, no_gradient_accumulation_fusion=False, no_masked_softmax_fusion=False,
        no_rope_fusion=False, num_rollout=1, lr_warmup_iters=0, lr_warmup_fraction=None, min_lr=0.0,
        weight_decay=0.0, clip_grad=1.0, adam_beta1=0.9, adam_beta2=0.98, adam_eps=1e-8,
        use_distributed_optimizer=False, lr_decay_style="constant", optimizer="sgd", sgd_momentum=0.0,
        optimizer_offload_fraction=1.0, optimizer_cpu_offload=False, overlap_cpu_optimizer_d2h_h2d=False,
        use_precision_aware_optimizer=False,
    )  # fmt: skip
    settings = optimizer_settings(args, 1e-2, 1, cuda=False)
    engine = MegatronTrainEngine(
        tiny_qwen3, settings, **model_config_overrides(args, transformer_engine=False, cuda=False)
    )
    config = get_model_config(engine.model[0])
    assert config.recompute_granularity is None  # Megatron's checkpointing needs CUDA RNG states
    assert config.hidden_dropout == 0.0 and config.attention_dropout == 0.0
    inner = getattr(engine.optimizer, "chained_optimizers", [engine.optimizer])
    assert all(isinstance(o.optimizer, torch.optim.SGD) for o in inner)
    sequences = [torch.tensor([1, 2, 3, 4, 5]), torch.tensor([6, 7, 8])]

    def loss_fn(logprobs: list[torch.Tensor], data: list[None]) -> torch.Tensor:
        return -sum(lp.sum() for lp in logprobs)

    before = engine.forward_logprobs(sequences)
    engine.train_step(sequences, [None, None], loss_fn)
    after = engine.forward_logprobs(sequences)
    assert sum(a.sum() for a in after) > sum(b.sum() for b in before)  # an SGD step on -log p raises log p


SLIME_TIS = '''
import pytest
import torch


def vanilla(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths, response_lengths):
    """slime's default TIS, written against its contract: pg_loss * clip(pi_old / mu, low, high)."""
    rho = torch.exp(torch.cat(train_log_probs) - torch.cat(rollout_log_probs))
    assert len(total_lengths) == len(response_lengths) == len(loss_masks)
    return pg_loss * rho.clamp(args.tis_clip_low, args.tis_clip), loss_masks, {"rho": rho}
'''


def test_slime_tis_hook_and_loss_flags_in_a_real_step(
    tiny_qwen3: Path, megatron_world: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from slime_like.trainer.actor import TrainActor
    from tests.megatron.algo_common import actor_args, make_data

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, os.environ.get(key, "0"))
    (tmp_path / "tis_under_test.py").write_text(SLIME_TIS)
    monkeypatch.syspath_prepend(str(tmp_path))

    def first_step(*flags: str) -> dict[str, float]:
        actor = TrainActor(actor_args(tiny_qwen3, ["--global-batch-size", "8", *flags]), 0, "127.0.0.1", 0)
        data = make_data()
        full = actor.engine.forward_logprobs(data.tokens)
        # SGLang's log-probs: the model's own, one token far off (rho = e^-2 there, e^0 elsewhere).
        rollout = [lp[-n:].tolist() for lp, n in zip(full, data.response_lengths, strict=True)]
        rollout[0][0] += 2.0
        return actor.train(0, make_data(rollout))

    builtin = first_step("--use-tis", "--tis-clip-low", "0.5")
    hooked = first_step("--use-tis", "--tis-clip-low", "0.5", "--custom-tis-function-path", "tis_under_test.vanilla")
    # slime's TIS through the hook equals the built-in one: same loss, same update.
    assert hooked["train/pg_loss"] == pytest.approx(builtin["train/pg_loss"], rel=1e-5)
    assert hooked["train/grad_norm"] == pytest.approx(builtin["train/grad_norm"], rel=1e-5)
    assert hooked["train/rho"] < 1.0  # the hook's metric, a token mean: one token of 19 at e^-2, the rest 1
    slime_mismatch = first_step("--get-mismatch-metrics", "--tis-clip-low", "0.5")
    assert slime_mismatch["train/pg_loss"] == pytest.approx(builtin["train/pg_loss"], rel=1e-5)  # slime's TIS path
    opsm = first_step("--use-opsm", "--use-kl-loss", "--use-unbiased-kl")
    assert opsm["train/opsm_clipfrac"] == 0.0 and opsm["train/kl_loss"] == 0.0  # first step: no drift, no KL
