"""Built-in reward scorers selected by --rm-type (rollout/rewards.py holds the registry)."""
