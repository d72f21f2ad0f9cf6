"""slime.rollout: generation, rewards, filters, data sources and rollout output types."""
