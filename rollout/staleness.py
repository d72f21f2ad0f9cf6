"""Weight-version staleness of generated samples (--fully-async): which groups may train, and the step's metrics.

A sample trained at weight version V has staleness V - (the version that generated its oldest token). With
--max-weight-staleness N a group trains only if every trainable sample's staleness is at most N; the oldest
version comes from the sample's recorded spans (`Sample.version_spans`, one [version, tokens] per stretch of
response tokens one weight version generated), or, for a generate function that records none, from the version
the continuous rollout stamped when it started the sample (a lower bound of every version since). A sample with
response tokens and neither is of unknown age: under a bound it counts as over it, so nothing over it trains.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from buffer.train_data import trainable
from slime_like.core.sample import Sample

# metadata key of the engines' weight version when the continuous rollout started a sample without tokens.
LAUNCH_VERSION = "launch_version"


def oldest_version(sample: Sample) -> int | None:
    """The weight version of the sample's oldest response token (None: no token, or not known)."""
    recorded = sample.oldest_version()
    if recorded is not None:
        return recorded
    return sample.metadata.get(LAUNCH_VERSION) if sample.response_length else None


def staleness(sample: Sample, version: int) -> int | None:
    """How many versions before `version` the sample's oldest token was generated (None: not known)."""
    oldest = oldest_version(sample)
    return None if oldest is None else version - oldest


def over_bound(sample: Sample, version: int, bound: int | None) -> bool:
    """Whether training the sample at `version` would exceed --max-weight-staleness `bound` (never when unbounded;
    a trainable sample of unknown age always does)."""
    if bound is None or not trainable(sample):
        return False
    age = staleness(sample, version)
    return age is None or age > bound


def stale_group(group: list[Sample], version: int, bound: int | None) -> bool:
    """A group trains whole or not at all (its samples share the group baseline): stale if any sample is."""
    return any(over_bound(s, version, bound) for s in group)


def staleness_metrics(groups: list[list[Sample]], version: int, prefix: str = "rollout") -> dict[str, Any]:
    """Staleness of the trainable samples trained at `version`: mean, max and the number at each value."""
    ages = [staleness(s, version) for g in groups for s in g if trainable(s)]
    known = [a for a in ages if a is not None]
    metrics: dict[str, Any] = {
        f"{prefix}/staleness_mean": sum(known) / len(known) if known else 0.0,
        f"{prefix}/staleness_max": max(known, default=0),
    }
    if len(known) < len(ages):
        metrics[f"{prefix}/staleness_unknown_samples"] = len(ages) - len(known)
    for age, n in sorted(Counter(known).items()):
        metrics[f"{prefix}/staleness_{age}_samples"] = n
    return metrics


def mask_older_spans(sample: Sample) -> bool:
    """--mask-offpolicy-in-partial-rollout: loss mask 0 on the tokens an older version than the sample's last one
    generated. Only where the spans cover the whole response (a generate function may add tokens of its own);
    returns whether the sample was masked."""
    spans = sample.version_spans
    if len(spans) < 2 or sum(n for _, n in spans) != sample.response_length:
        return False
    newest = max(v for v, _ in spans)
    mask = list(sample.loss_mask) if sample.loss_mask is not None else [1] * sample.response_length
    position, masked = 0, False
    for version, n in spans:
        if version < newest:
            mask[position : position + n] = [0] * n
            masked = masked or n > 0
        position += n
    sample.loss_mask = mask
    return masked
