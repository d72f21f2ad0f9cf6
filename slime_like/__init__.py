"""slime-like: a Megatron + SGLang native RL post-training engine."""
