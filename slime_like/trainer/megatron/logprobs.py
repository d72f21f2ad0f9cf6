"""Per-token log-probs and entropies from logits whose vocabulary is split over TP ranks."""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.distributed as dist


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Log-prob of targets[:, j] at position j from vocab-parallel logits [rows, T, V/tp]."""
    from megatron.core import tensor_parallel

    # vocab_parallel_cross_entropy works in place on its input: give it a float copy.
    return -tensor_parallel.vocab_parallel_cross_entropy(logits.to(torch.float32, copy=True), targets)


class _VocabParallelEntropy(torch.autograd.Function):
    """Entropy of softmax over a vocabulary split across TP ranks, with an analytic backward.

    dH/dz_i = -p_i (log p_i + H) needs only local p and the global H, so the backward is local
    (autograd through the all-reduces would miss the other ranks' terms).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, group) -> torch.Tensor:
        shift = logits.max(dim=-1, keepdim=True).values
        dist.all_reduce(shift, op=dist.ReduceOp.MAX, group=group)
        z = logits - shift
        sum_exp = z.exp().sum(-1, keepdim=True)
        dist.all_reduce(sum_exp, group=group)
        log_p = z - sum_exp.log()
        entropy = -(log_p.exp() * log_p).sum(-1, keepdim=True)
        dist.all_reduce(entropy, group=group)
        ctx.save_for_backward(log_p, entropy)
        return entropy.squeeze(-1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        log_p, entropy = ctx.saved_tensors
        return -log_p.exp() * (log_p + entropy) * grad.unsqueeze(-1), None


def vocab_parallel_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the full vocabulary, logits split over TP ranks ([..., V/tp])."""
    from megatron.core import parallel_state as mpu

    return _VocabParallelEntropy.apply(logits.float(), mpu.get_tensor_model_parallel_group())


def logprobs_and_entropy(
    logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool, entropy_grad: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """token_logprobs [and vocab_parallel_entropy] of [rows, T, V/tp] logits; entropy without a graph
    when entropy_grad is False. Without TP both come from one log-softmax (one pass over the vocabulary).

    targets[:, j] is the token position j predicts (the next token of its sequence: MicroBatch.targets,
    or with context parallel the full sequence's next token at each local position)."""
    from megatron.core import parallel_state as mpu

    grad_context = nullcontext() if entropy_grad else torch.no_grad()
    if mpu.get_tensor_model_parallel_world_size() > 1:
        entropy = None
        if with_entropy:
            with grad_context:
                entropy = vocab_parallel_entropy(logits)
        return token_logprobs(logits, targets), entropy
    log_p = torch.log_softmax(logits.float(), dim=-1)
    logprobs = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with grad_context:
            entropy = -(log_p.exp() * log_p).sum(-1)
    return logprobs, entropy
