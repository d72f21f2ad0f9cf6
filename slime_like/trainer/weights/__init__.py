"""Weight updates: trainer (HF-named full tensors) -> running SGLang servers, in place.

base.py (interface, update protocol, buckets), one module per transport (distributed.py, tensor.py, disk.py),
updater.py (retries, disk fallback, all trainer ranks together), check.py (post-update log-prob check).
"""
