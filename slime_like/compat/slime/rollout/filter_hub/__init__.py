"""slime.rollout.filter_hub: dynamic-sampling filters and their output type."""
