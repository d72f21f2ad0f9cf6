"""Megatron-core training backend: CPU compatibility, parallel state, mbridge model provider,
optimizer, sequence packing, the train engine and distributed checkpoints.

Modules import megatron lazily (it takes seconds), so importing this package is cheap.
"""
