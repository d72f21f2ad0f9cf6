"""A custom loss and a custom advantage estimator with slime's signatures.

--loss-type custom_loss --custom-loss-function-path slime_plugins.algorithms.reinforce_loss
--custom-advantage-function-path slime_plugins.algorithms.reward_minus_half
"""

import torch
from slime.backends.megatron_utils.loss import get_log_probs_and_entropy


def reinforce_loss(args, batch, logits, sum_of_sample_mean):
    """REINFORCE, -A * log pi per token, averaged by slime's reducer; reports the mean log-prob and entropy."""
    _, out = get_log_probs_and_entropy(
        logits,
        args=args,
        unconcat_tokens=batch["unconcat_tokens"],
        total_lengths=batch["total_lengths"],
        response_lengths=batch["response_lengths"],
        with_entropy=True,
    )
    log_probs = torch.cat(out["log_probs"])
    advantages = torch.cat(batch["advantages"])
    loss = sum_of_sample_mean(-advantages * log_probs)
    if log_probs.numel() == 0:
        loss = loss + 0 * logits.sum()
    metrics = {
        "logp": sum_of_sample_mean(log_probs).detach(),
        "entropy": sum_of_sample_mean(torch.cat(out["entropy"])).detach(),
    }
    return loss, metrics


def reward_minus_half(args, rollout_data):
    """Advantage = raw reward - 0.5 on every token (returns the same); also records what it was handed."""
    rollout_data["advantages"] = [
        torch.full((n,), r - 0.5)
        for r, n in zip(rollout_data["raw_reward"], rollout_data["response_lengths"], strict=True)
    ]
    rollout_data["returns"] = rollout_data["advantages"]
    SEEN.append({k: rollout_data[k] for k in ("rewards", "raw_reward", "kl", "total_lengths")})


SEEN = []
