"""A vision-language checkpoint's SGLang server starts with its image-embedding cache off (rollout/sglang_server.py:
VLM_ENV): SGLang keys the cache by the image's hash and keeps it across weight updates, so after an update that trains
the vision tower a seen image would be served with the old tower's embedding. Text checkpoints keep SGLang's default.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollout.sglang_server import SGLangServer


def _checkpoint(root: Path, vision: bool) -> Path:
    root.mkdir()
    config = {"model_type": "qwen2_5_vl", "vision_config": {"depth": 2}} if vision else {"model_type": "qwen3"}
    (root / "config.json").write_text(json.dumps(config))
    return root


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_vision_language_servers_start_without_the_image_embedding_cache(
    tmp_path: Path, device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SGLANG_VLM_CACHE_SIZE_MB", raising=False)
    _, env = SGLangServer(_checkpoint(tmp_path / "vl", True), port=30000, device=device).command()
    assert env["SGLANG_VLM_CACHE_SIZE_MB"] == "0"
    _, env = SGLangServer(_checkpoint(tmp_path / "text", False), port=30000, device=device).command()
    assert "SGLANG_VLM_CACHE_SIZE_MB" not in env


def test_a_users_cache_size_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_VLM_CACHE_SIZE_MB", "64")  # inherited by the server as the user set it
    _, env = SGLangServer(_checkpoint(tmp_path / "vl", True), port=30000, device="cpu").command()
    assert "SGLANG_VLM_CACHE_SIZE_MB" not in env
