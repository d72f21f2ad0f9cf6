"""Megatron's optimizer (Adam or SGD, optional distributed optimizer, CPU offload on GPU) and learning-rate scheduler."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slime_like.trainer.megatron.cpu_compat import cuda_to_cpu


@dataclass
class OptimizerSettings:
    """What the engine needs to build Megatron's optimizer and scheduler."""

    lr: float = 1e-6
    min_lr: float = 0.0
    weight_decay: float = 0.0
    clip_grad: float = 1.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-8
    use_distributed_optimizer: bool = True
    lr_warmup_steps: int = 0
    lr_decay_steps: int | None = None  # None: constant lr after warmup
    lr_decay_style: str = "constant"  # constant, linear, cosine, inverse-square-root
    optimizer: str = "adam"  # adam (AdamW-style decoupled decay) or sgd
    sgd_momentum: float = 0.9
    # GPU only (the trainer passes False without CUDA): megatron-core's HybridDeviceOptimizer and TE's FusedAdam.
    optimizer_cpu_offload: bool = False
    optimizer_offload_fraction: float = 1.0
    overlap_cpu_optimizer_d2h_h2d: bool = False
    use_precision_aware_optimizer: bool = False
    stateless_adam: bool = False  # --use-stateless-adam: Adam's step from zero moments, none kept


def build_optimizer(model: list[torch.nn.Module], settings: OptimizerSettings, params_dtype: torch.dtype):
    """Megatron's optimizer over the DDP-wrapped model chunks, and an OptimizerParamScheduler."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    config = OptimizerConfig(
        optimizer=settings.optimizer,
        sgd_momentum=settings.sgd_momentum,
        optimizer_cpu_offload=settings.optimizer_cpu_offload,
        optimizer_offload_fraction=settings.optimizer_offload_fraction,
        overlap_cpu_optimizer_d2h_h2d=settings.overlap_cpu_optimizer_d2h_h2d,
        use_precision_aware_optimizer=settings.use_precision_aware_optimizer,
        lr=settings.lr,
        min_lr=settings.min_lr,
        weight_decay=settings.weight_decay,
        clip_grad=settings.clip_grad,
        adam_beta1=settings.adam_beta1,
        adam_beta2=settings.adam_beta2,
        adam_eps=settings.adam_eps,
        use_distributed_optimizer=settings.use_distributed_optimizer,
        bf16=params_dtype is torch.bfloat16,
        fp16=params_dtype is torch.float16,
        params_dtype=params_dtype,
    )
    with cuda_to_cpu():
        optimizer = get_megatron_optimizer(config, model)
    if settings.stateless_adam:
        from slime_like.trainer.megatron.stateless_adam import make_stateless

        make_stateless(optimizer)
    decay_steps = settings.lr_decay_steps or settings.lr_warmup_steps + 1
    scheduler = OptimizerParamScheduler(
        optimizer,
        init_lr=0.0 if settings.lr_warmup_steps else settings.lr,
        max_lr=settings.lr,
        min_lr=settings.min_lr,
        lr_warmup_steps=settings.lr_warmup_steps,
        lr_decay_steps=decay_steps,
        lr_decay_style=settings.lr_decay_style if settings.lr_decay_steps else "constant",
        start_wd=settings.weight_decay,
        end_wd=settings.weight_decay,
        wd_incr_steps=decay_steps,
        wd_incr_style="constant",
    )
    return optimizer, scheduler
