"""The algorithm layer's named choices, importable without torch so that argument parsing stays instant."""

ESTIMATORS = ("grpo", "gspo", "cispo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo")
# Estimators whose advantage is one number per sequence: a per-token KL reward has no place in them.
SEQUENCE_LEVEL = ("grpo", "gspo", "cispo", "rloo")
AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_TYPES = ("k1", "k2", "k3", "low_var_kl")
MIS_LEVELS = ("token", "sequence", "geometric")
LOSS_TYPES = ("policy_loss", "sft_loss", "custom_loss")
