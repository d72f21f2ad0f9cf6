"""The bottom layer: the Sample type, process management, plugin loading, errors and logging set-up.

It imports nothing else of ours; every other layer may import it (tests/unit/test_layers.py).
"""
