"""The interface every weight-update transport implements, and the bucketing they share."""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator

import torch

NamedTensors = Iterable[tuple[str, torch.Tensor]]


class WeightTransport(abc.ABC):
    """Moves one full set of HF-named weights from trainer rank 0 into every SGLang server."""

    def __init__(self, server_urls: list[str], bucket_bytes: int) -> None:
        self.server_urls = list(server_urls)
        self.bucket_bytes = bucket_bytes

    def connect(self) -> None:  # noqa: B027 - optional hook
        """Prepare the channel to the servers (called once, and again after a failure)."""

    @abc.abstractmethod
    def send(self, named_tensors: NamedTensors, version: int) -> None:
        """Push all tensors to every server and tag them with weight `version`."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the channel."""


def buckets(named_tensors: NamedTensors, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group tensors in order into lists of at most `bucket_bytes` (a larger tensor gets a bucket alone)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket
