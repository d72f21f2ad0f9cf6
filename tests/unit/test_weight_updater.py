"""WeightUpdater's retry and fallback decisions and log lines, and the bucket layout the transports share.

The transports here are stand-ins that fail on command; the real ones are tested against SGLang servers in
tests/integration/test_weight_update*.py.
"""

from __future__ import annotations

import logging

import pytest
import torch

from slime_like.core.errors import WeightUpdateError
from slime_like.trainer.weights.base import WeightTransport, buckets, flat_size, flatten_into
from slime_like.trainer.weights.updater import WeightUpdater

TENSORS = [("a", torch.arange(6.0).reshape(2, 3)), ("b", torch.arange(5, dtype=torch.bfloat16)), ("c", torch.ones(7))]


class Scripted(WeightTransport):
    """Fails with the next scripted error (None: succeeds), after reading `reads` tensors."""

    def __init__(self, name: str, errors: list[Exception | None], log: list, reads: int = 1) -> None:
        super().__init__([], 1 << 20)
        self.name, self.errors, self.log, self.reads = name, errors, log, reads

    def update(self, named_tensors, version: int, pause_mode: str = "abort") -> None:
        for _, (name, _) in zip(range(self.reads), named_tensors, strict=False):
            self.log.append((self.name, version, name))
        error = self.errors.pop(0)
        if error is not None:
            raise error

    def send(self, named_tensors, version: int) -> None:  # pragma: no cover - update is scripted
        raise AssertionError

    def close(self) -> None:
        self.log.append((self.name, "closed"))


def _exports(log: list):
    """An export callable counting how far each export was iterated (the collective must be drained)."""

    def export():
        def gen():
            yield from TENSORS
            log.append("export drained")

        return gen()

    return export


def test_retry_then_fallback_then_success(caplog) -> None:
    log: list = []
    primary = [WeightUpdateError("server gone"), RuntimeError("broadcast timed out")]
    factories = {
        "distributed": lambda: Scripted("distributed", primary, log),
        "disk": lambda: Scripted("disk", [None], log),
    }
    updater = WeightUpdater(factories, "distributed", "disk", retries=1)
    with caplog.at_level(logging.ERROR):
        assert updater.update(_exports(log), 3) == "disk"
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "weight update to version 3 over distributed failed (attempt 1 of 3): WeightUpdateError: server gone; retrying",
        "weight update to version 3 over distributed failed (attempt 2 of 3): RuntimeError: broadcast timed out; "
        "falling back to disk",
    ]
    # Every attempt drained its export; a failed transport was closed before the next one.
    assert log.count("export drained") == 3
    assert log.index(("distributed", "closed")) < log.index(("disk", 3, "a"))
    assert updater.version == 3


def test_all_attempts_failing_raise_every_cause(caplog) -> None:
    log: list = []
    factories = {
        "tensor": lambda: Scripted("tensor", [WeightUpdateError("refused")], log),
        "disk": lambda: Scripted("disk", [OSError("disk full")], log),
    }
    updater = WeightUpdater(factories, "tensor", "disk", retries=0)
    with pytest.raises(
        WeightUpdateError, match=r"version 4 failed: tensor: WeightUpdateError: refused \| disk: OSError"
    ):
        updater.update(_exports(log), 4)
    assert caplog.records[-1].getMessage().endswith("OSError: disk full; giving up")
    assert updater.version is None


def test_a_bug_is_not_retried() -> None:
    log: list = []
    factories = {"tensor": lambda: Scripted("tensor", [TypeError("bad argument")], log), "disk": lambda: None}
    with pytest.raises(WeightUpdateError, match="TypeError: bad argument"):
        WeightUpdater(factories, "tensor", "disk", retries=3).update(_exports(log), 1)
    assert log.count("export drained") == 1  # no retry, no fallback


def test_versions_must_increase() -> None:
    log: list = []
    updater = WeightUpdater({"disk": lambda: Scripted("disk", [None, None], log)}, "disk", None, retries=0)
    updater.update(_exports(log), 2)
    with pytest.raises(ValueError, match="weight version 2 is not above the current one"):
        updater.update(_exports(log), 2)


def test_in_place_transports_take_the_in_place_export_and_a_disk_fallback_the_full_one() -> None:
    """An update over an in-place transport sends export_in_place's tensors (frozen weights the engines hold left out:
    megatron/frozen_weights.py); its disk fallback writes a whole checkpoint, so it gets the full export."""
    log: list = []
    factories = {
        "tensor": lambda: Scripted("tensor", [WeightUpdateError("refused")], log, reads=3),
        "disk": lambda: Scripted("disk", [None], log, reads=3),
    }
    updater = WeightUpdater(factories, "tensor", "disk", retries=0, in_place={"tensor"})
    assert updater.update(_exports(log), 1, export_in_place=lambda: iter(TENSORS[:1])) == "disk"
    assert [entry for entry in log if entry[0] in ("tensor", "disk") and len(entry) == 3] == [
        ("tensor", 1, "a"), ("disk", 1, "a"), ("disk", 1, "b"), ("disk", 1, "c"),
    ]  # fmt: skip


def test_buckets_and_flat_layout() -> None:
    assert [[n for n, _ in b] for b in buckets(TENSORS, 40)] == [["a", "b"], ["c"]]  # 24 + 10 bytes, then 28
    buffer = torch.zeros(flat_size(TENSORS, 64), dtype=torch.uint8)
    flat, metadata = flatten_into(TENSORS, buffer, align=64)
    assert [m["start_idx"] for m in metadata] == [0, 64, 128]
    for (name, tensor), meta in zip(TENSORS, metadata, strict=True):
        back = flat[meta["start_idx"] : meta["end_idx"]].view(meta["dtype"]).view(meta["shape"])
        assert meta["name"] == name and torch.equal(back, tensor)
    # Without alignment it is SGLang's FlattenedTensorBucket: the bytes back to back.
    packed, _ = flatten_into(TENSORS, torch.zeros(flat_size(TENSORS), dtype=torch.uint8))
    expected = torch.cat([t.reshape(-1).view(torch.uint8) for _, t in TENSORS])
    assert torch.equal(packed, expected)


def test_the_disk_transport_copies_every_file_but_the_weights(tmp_path) -> None:
    """Kimi-K2's config.json names custom code (auto_map) and its tokenizer is tiktoken: a written version must
    carry them, or SGLang cannot load it; the HF weights themselves are not copied (the update writes its own)."""
    from slime_like.trainer.weights.disk import _model_files

    names = ["config.json", "configuration_deepseek.py", "tiktoken.model", "tokenizer_config.json",
             "model-00001-of-00002.safetensors", "model.safetensors.index.json", "pytorch_model.bin"]  # fmt: skip
    for name in names:
        (tmp_path / name).write_text("x")
    (tmp_path / "sub").mkdir()
    assert [p.name for p in _model_files(tmp_path)] == [
        "config.json",
        "configuration_deepseek.py",
        "tiktoken.model",
        "tokenizer_config.json",
    ]
