"""Plugins written against slime's API (as a slime user would), run unchanged by tests/integration/test_slime_plugins.py
and tests/megatron/test_slime_hooks.py. Their folder goes on sys.path, as slime's examples do with PYTHONPATH.

The tiny test model cannot choose to search or call a tool, so each turn is steered with a `regex` sampling
parameter (SGLang's constrained decoding); the tokens and log-probs still come from the server.
"""
