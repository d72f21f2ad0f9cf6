"""A single-process Megatron world (gloo, TP=PP=DP=1) shared by the in-process tests, and tiny hybrid checkpoints."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def megatron_world() -> None:
    """Initialise torch.distributed and Megatron parallel state once for this pytest process."""
    from slime_like.trainer.megatron.parallel import init_parallel

    init_parallel(tp=1, pp=1, seed=1234)


@pytest.fixture(scope="session")
def tiny_hybrid(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Tiny Qwen3-Next / Qwen3.5 / Qwen3.5-MoE checkpoints by family name, each written once per session."""
    from tests.megatron.tiny_families import make_qwen3_5, make_qwen3_next

    made: dict[str, Path] = {}

    def make(family: str) -> Path:
        if family not in made:
            out = tmp_path_factory.mktemp(f"tiny-{family}")
            if family == "qwen3_next":
                made[family] = make_qwen3_next(out, tiny_qwen3)
            else:
                made[family] = make_qwen3_5(out, tiny_qwen3, moe=family == "qwen3_5_moe")
        return made[family]

    return make
