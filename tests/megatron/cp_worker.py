"""torchrun worker: zig-zag context parallel on two gloo ranks (CP=2, DP=1), without a transformer.

Usage: torchrun --nproc_per_node 2 tests/megatron/cp_worker.py OUT_DIR HF_DIR

Megatron's local attention refuses CP > 1, so no transformer runs here: a position-wise toy model
(embedding -> tanh -> vocabulary projection) stands in for it, and every other step is the engine's:
the zig-zag shard of "thd" micro-batches, log-probs and entropies of this rank's positions against the
full sequences' targets, the autograd gather back to full per-sequence tensors, the loss share times
schedule.loss_rescale, Megatron's own forward_step_calc_loss (which multiplies by the CP size), and a
gradient average over DP x CP as Megatron's DDP does. Each rank saves its per-sequence outputs and the
averaged gradients to OUT_DIR/rank{r}.pt; it also records the engine's refusal to build a model with CP
on the local spec.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

VOCAB, HIDDEN = 512, 16


def toy_model(seed: int = 0) -> torch.nn.ModuleDict:
    """The position-wise stand-in for a transformer (the same weights on every rank)."""
    torch.manual_seed(seed)
    model = torch.nn.ModuleDict({"embed": torch.nn.Embedding(VOCAB, HIDDEN), "out": torch.nn.Linear(HIDDEN, VOCAB)})
    with torch.no_grad():
        model["out"].weight.mul_(8.0)  # peaked distributions, so a misplaced target shows
    return model


def logits_of(model: torch.nn.ModuleDict, tokens: torch.Tensor) -> torch.Tensor:
    """[1, T] tokens -> [1, T, V] logits."""
    return model["out"](torch.tanh(model["embed"](tokens)))


def micro_batches(seqs: list[torch.Tensor], cp: int) -> list:
    """The fixed batch in two "thd" micro-batches, each sequence padded for the CP split."""
    from slime_like.trainer.megatron.packing import pack, pad_multiple

    half = len(seqs) // 2
    return [pack(seqs, ids, "thd", pad_multiple(cp_size=cp)) for ids in (range(half), range(half, len(seqs)))]


def loss_share(logprobs: list[torch.Tensor], entropy: list[torch.Tensor], total: int) -> torch.Tensor:
    """A non-linear loss of whole sequences (sequence means squared, plus entropy)."""
    return sum((lp.mean() ** 2) + 0.1 * e.sum() / total for lp, e in zip(logprobs, entropy, strict=True))


def main(out_dir: str, hf_dir: str) -> None:
    """Gather and gradient checks of CP=2, then the engine's refusal on the CPU."""
    from megatron.core import parallel_state as mpu
    from megatron.core.pipeline_parallel.schedules import forward_step_calc_loss

    from slime_like.trainer.megatron import context_parallel as cp_lib
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.logprobs import logprobs_and_entropy
    from slime_like.trainer.megatron.parallel import init_parallel
    from slime_like.trainer.megatron.schedule import loss_rescale
    from tests.megatron.common import fixed_batch, num_targets

    init_parallel(cp=2, seed=1234)
    cp, rank = mpu.get_context_parallel_world_size(), mpu.get_context_parallel_rank()
    assert cp == 2 and mpu.get_data_parallel_world_size() == 1
    model = toy_model()
    seqs = fixed_batch()
    mbs = micro_batches(seqs, cp)
    config = SimpleNamespace(timers=None, calculate_per_token_loss=False)  # what forward_step_calc_loss reads
    logprobs, entropies, local_tokens = [], [], []
    for mb in mbs:
        shard = cp_lib.shard(mb, cp, rank)
        local_tokens.append(shard.tokens)
        lp, ent = logprobs_and_entropy(logits_of(model, shard.tokens), shard.targets, with_entropy=True)
        group = mpu.get_context_parallel_group()
        lp_seq = mb.per_sequence(cp_lib.gather(lp, shard, group))
        ent_seq = mb.per_sequence(cp_lib.gather(ent, shard, group))
        logprobs += [x.detach() for x in lp_seq]
        entropies += [x.detach() for x in ent_seq]
        scaled = loss_share(lp_seq, ent_seq, num_targets(seqs)) * loss_rescale(len(mbs))
        output, _ = forward_step_calc_loss(
            model,
            scaled,
            lambda out: (out, {}),
            config,
            None,
            False,
            len(mbs),
            [],
            cp_group_size=cp,
            is_last_stage=True,
        )
        output.backward()
    # Megatron's DDP: gradients times 1 / (DP x CP), summed over the DP x CP group.
    grads = {}
    for name, param in model.named_parameters():
        grad = param.grad / mpu.get_data_parallel_world_size(with_context_parallel=True)
        dist.all_reduce(grad, group=mpu.get_data_parallel_group(with_context_parallel=True))
        grads[name] = grad
    try:
        MegatronTrainEngine(hf_dir)
        refusal = ""
    except ValueError as exc:
        refusal = str(exc)
    results = {"logprobs": logprobs, "entropy": entropies, "grads": grads, "tokens": local_tokens, "refusal": refusal}
    torch.save(results, Path(out_dir) / f"rank{dist.get_rank()}.pt")
    mpu.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
