"""The LoRA transport's medium: shared memory when every server runs on this machine, disk otherwise."""

from __future__ import annotations

import pytest

from slime_like.trainer.megatron.lora import LoraSettings
from slime_like.trainer.weights.lora import LoraTransport, MultiLoraTransport, on_this_machine

SETTINGS = LoraSettings(4, 8.0, targets=("linear_qkv",))
REMOTE = "http://192.0.2.7:30000"  # TEST-NET-1 (RFC 5737): never an address of this machine


def test_local_servers_load_from_shared_memory_and_remote_ones_from_disk(tmp_path) -> None:
    assert on_this_machine("http://127.0.0.1:30000") and on_this_machine("http://localhost:1")
    assert not on_this_machine(REMOTE)
    local = LoraTransport(["http://127.0.0.1:30000", "http://127.0.0.1:30001"], SETTINGS, "base", tmp_path)
    assert local.medium == "tensor"
    assert LoraTransport(["http://127.0.0.1:30000", REMOTE], SETTINGS, "base", tmp_path).medium == "disk"
    assert MultiLoraTransport([REMOTE], SETTINGS, "base", tmp_path, medium="tensor").medium == "tensor"  # forced
    with pytest.raises(ValueError, match="choose one of auto, tensor, disk"):
        LoraTransport([REMOTE], SETTINGS, "base", tmp_path, medium="nccl")
