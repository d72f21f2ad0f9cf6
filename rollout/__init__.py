"""Rollout: SGLang servers behind sglang-router, generate functions, rewards and filters."""
