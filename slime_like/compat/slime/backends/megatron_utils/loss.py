"""slime's loss helpers over our trainer: a custom loss gets per-token log-probs, not logits (docs/plugins.md)."""

from slime_like.trainer.algorithms.slime_contract import ResponseLogits, get_log_probs_and_entropy

__all__ = ["ResponseLogits", "get_log_probs_and_entropy"]
