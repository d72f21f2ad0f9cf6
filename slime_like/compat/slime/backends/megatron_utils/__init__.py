"""slime.backends.megatron_utils: helpers for custom losses."""
