"""slime's agent rollout building blocks (`slime.agent`), over our OpenAI-compatible endpoint."""
