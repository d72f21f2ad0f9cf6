"""Shared by the in-process tests and the torchrun worker: a fixed batch, losses and a training run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

LENGTHS = [5, 17, 9, 30, 2, 12, 21, 7]
MAX_TOKENS = 40  # several micro-batches per DP rank


def fixed_batch(vocab_size: int = 512, seed: int = 0) -> list[torch.Tensor]:
    """Variable-length token sequences, the same in every process."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (n,), generator=g) for n in LENGTHS]


def token_ce_loss(total_tokens: int, entropy_coef: float = 0.0):
    """Token-level cross-entropy (minus an entropy bonus): a micro-batch's share / global token count."""

    def loss_fn(logprobs: list[torch.Tensor], data: list, entropy: list[torch.Tensor] | None = None):
        share = -sum(lp.sum() for lp in logprobs) / total_tokens
        if entropy is not None:
            share = share - entropy_coef * sum(e.sum() for e in entropy) / total_tokens
        return share, {"tokens": float(sum(lp.numel() for lp in logprobs))}

    return loss_fn


def num_targets(seqs: list[torch.Tensor]) -> int:
    """Tokens that get a log-prob (all but the first of each sequence)."""
    return sum(len(s) - 1 for s in seqs)


def train_run(hf_dir: str | Path) -> dict:
    """After init_parallel: five optimizer steps on the fixed batch, then log-probs and HF weights.

    Steps: three plain cross-entropy steps, one with an entropy bonus, one on a single sequence
    (with DP=2 one rank then runs only a filler micro-batch).
    """
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.optimizer import OptimizerSettings

    settings = OptimizerSettings(lr=1e-3, weight_decay=0.01, clip_grad=1.0)
    engine = MegatronTrainEngine(hf_dir, settings, max_tokens_per_micro_batch=MAX_TOKENS)
    seqs = fixed_batch()
    ce = token_ce_loss(num_targets(seqs))
    metrics = [engine.train_step(seqs, [None] * len(seqs), ce) for _ in range(3)]
    bonus = token_ce_loss(num_targets(seqs), entropy_coef=0.1)
    metrics.append(engine.train_step(seqs, [None] * len(seqs), bonus, with_entropy=True))
    metrics.append(engine.train_step(seqs[:1], [None], token_ce_loss(num_targets(seqs[:1]))))
    logprobs, entropy = engine.forward_logprobs(seqs, with_entropy=True)
    single = engine.forward_logprobs(seqs[:1])
    weights = {name: t.clone() for name, t in engine.export_hf_weights()}
    return {"metrics": metrics, "logprobs": logprobs, "entropy": entropy, "single": single, "weights": weights}


def forward_on_device(module: torch.nn.Module, *inputs: torch.Tensor) -> torch.Tensor:
    """The module's forward on its own device (CUDA on a GPU machine) with the inputs moved there; output on CPU."""
    device = next(module.parameters()).device
    return module(*(t.to(device) for t in inputs)).cpu()


def torch_dist_to_hf_round_trip(engine: Any, hf_dir: str | Path, tmp_path: Path) -> dict[str, torch.Tensor]:
    """`engine` saved as a torch_dist checkpoint (tmp_path/ckpt) and converted back to HF with `hf_dir`'s config
    (tools/convert_torch_dist_to_hf.py, to tmp_path/hf): the converted tensors, checked to be bit-exactly the engine's
    HF export, every tensor included."""
    from tests.megatron.test_families import safetensors_of
    from tools.convert_torch_dist_to_hf import main as torch_dist_to_hf

    exported = {n: t.clone() for n, t in engine.export_hf_weights()}
    engine.save_checkpoint(tmp_path / "ckpt")
    torch_dist_to_hf(["--load", str(tmp_path / "ckpt"), "--hf-checkpoint", str(hf_dir), "--save", str(tmp_path / "hf")])
    converted = safetensors_of(tmp_path / "hf")
    assert sorted(converted) == sorted(exported)
    for name, tensor in converted.items():
        assert torch.equal(tensor, exported[name]), name
    return converted
