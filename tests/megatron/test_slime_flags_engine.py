"""Dropout and --optimizer sgd reach the real Megatron model and optimizer; on CPU recompute stays off."""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

import torch

from slime_like.megatron.flags import model_config_overrides, optimizer_settings


def test_flags_reach_megatron(tiny_qwen3: Path, megatron_world: None) -> None:
    from megatron.core.utils import get_model_config

    from slime_like.megatron.engine import MegatronTrainEngine

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
