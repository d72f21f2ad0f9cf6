"""Shared fixtures: tiny models made once per test session, GPU tests skipped without CUDA."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
# Keep every library off the network and every test's threads modest on 2 cores.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip `gpu`-marked tests when CUDA is not available."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (marked gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _make_tiny(tmp_path_factory: pytest.TempPathFactory, family: str, **overrides: object) -> Path:
    from tools.make_tiny_model import make_tiny_model, parse_args

    out = tmp_path_factory.mktemp(f"tiny-{family}")
    args = parse_args(["--out", str(out), "--family", family])
    for key, value in overrides.items():
        setattr(args, key, value)
    return make_tiny_model(args)


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3 checkpoint (tied embeddings), made once per session."""
    return _make_tiny(tmp_path_factory, "qwen3")


@pytest.fixture(scope="session")
def tiny_qwen2_untied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 checkpoint with untied embeddings."""
    return _make_tiny(tmp_path_factory, "qwen2", tie_word_embeddings=False)


@pytest.fixture(scope="session")
def tiny_qwen3_moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3-MoE checkpoint (4 experts, top-2), untied like every released Qwen3-MoE (SGLang's
    Qwen3-MoE ignores tie_word_embeddings and would serve a random LM head)."""
    return _make_tiny(tmp_path_factory, "qwen3_moe", tie_word_embeddings=False)
