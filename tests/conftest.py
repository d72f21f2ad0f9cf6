"""Test tiers by cost, set from the directory; tiny models made once per session; GPU tests skipped without CUDA.

tests/unit        -m unit         seconds, in this process only (no subprocess, no server)
tests/megatron    -m megatron     real Megatron: in-process models and 2-rank torchrun worlds
tests/integration -m integration  real SGLang servers, the router, Ray, worker and sandbox processes
tests/gpu         -m gpu          needs CUDA; skipped on CPU-only machines
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
# Keep every library off the network and every test's threads modest on 2 cores.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


TIERS = ("unit", "megatron", "integration", "gpu")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test with its directory's tier; skip the `gpu` tier when CUDA is not available."""
    import torch

    skip = None if torch.cuda.is_available() else pytest.mark.skip(reason="needs CUDA (tests/gpu)")
    for item in items:
        tier = item.path.relative_to(REPO_ROOT / "tests").parts[0]
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: tests live in one of tests/{{{','.join(TIERS)}}}/")
        item.add_marker(tier)
        if tier == "gpu" and skip is not None:
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


def make_tiny_vlm(tmp_path_factory: pytest.TempPathFactory, family: str) -> Path:
    """A tiny random vision-language checkpoint with its processor (tools/make_tiny_vlm.py)."""
    from tools.make_tiny_vlm import make_tiny_vlm as make
    from tools.make_tiny_vlm import parse_args

    return make(parse_args(["--out", str(tmp_path_factory.mktemp(f"tiny-{family}")), "--family", family]))


@pytest.fixture(scope="session")
def tiny_qwen2_5_vl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2.5-VL checkpoint and processor (one image: 4-16 tokens), made once per session."""
    return make_tiny_vlm(tmp_path_factory, "qwen2_5_vl")
