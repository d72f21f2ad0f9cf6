"""A single-process Megatron world (gloo, TP=PP=DP=1) shared by the in-process tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def megatron_world() -> None:
    """Initialise torch.distributed and Megatron parallel state once for this pytest process."""
    from slime_like.trainer.megatron.parallel import init_parallel

    init_parallel(tp=1, pp=1, seed=1234)
