"""slime's Sample is ours: slime_like.core.sample.Sample carries slime's fields, Sample.Status and helpers."""

from typing import Any

from slime_like.core.sample import PrefixCacheInfo, Sample, SpecInfo, Status

# A trainer-side batch in slime: column name -> one entry per sample.
RolloutBatch = dict[str, list[Any]]

__all__ = ["PrefixCacheInfo", "RolloutBatch", "Sample", "SpecInfo", "Status"]
