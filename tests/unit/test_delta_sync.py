"""Delta weight sync without servers: the encodings and checksums on hand-built bytes, and the trainer's publisher
(slime_like/trainer/weights/delta.py) against the host-side apply (rollout/delta_pull.py) on a small safetensors checkpoint."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
import zstandard
from safetensors.torch import load_file, save_file

from rollout import delta_format as fmt
from rollout import delta_pull
from slime_like.trainer.weights.delta import DeltaDiskTransport

pytestmark = pytest.mark.unit


def as_bytes(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.uint8).numpy().reshape(-1).copy()


@pytest.mark.parametrize("encoding", fmt.ENCODINGS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip(encoding: str, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    old_t = torch.randn(64, 33, generator=g).to(dtype)
    new_t = old_t.clone()
    new_t[3, :5] += 0.25  # a few changed elements; the rest stay byte-identical
    new_t[60, 32] = -7.0
    old, new = as_bytes(old_t), as_bytes(new_t)
    blob = fmt.encode(new, old, encoding)
    region = old.copy()
    digest = fmt.apply(region, blob, encoding, "xxh3-128")
    assert np.array_equal(region, new)
    assert digest == fmt.checksum("xxh3-128", new)
    assert torch.equal(torch.from_numpy(region).view(dtype).view(64, 33), new_t)
    assert len(blob) < new.size // 4  # unchanged bytes compress away


def test_nothing_changed_is_no_delta() -> None:
    data = np.arange(100, dtype=np.uint8)
    assert fmt.encode(data, data.copy(), "xor") is None
    assert fmt.encode(data, data.copy(), "overwrite") is None


def test_overwrite_layout_is_count_positions_values() -> None:
    old, new = np.array([0, 1, 2, 3], np.uint8), np.array([0, 9, 2, 7], np.uint8)
    payload = zstandard.ZstdDecompressor().decompress(fmt.encode(new, old, "overwrite"))
    assert payload == (2).to_bytes(8, "little") + (1).to_bytes(4, "little") + (3).to_bytes(4, "little") + bytes([9, 7])


def test_xor_twice_reverts_overwrite_twice_stays() -> None:
    old, new = np.array([5, 6, 7, 8], np.uint8), np.array([5, 0, 7, 1], np.uint8)
    for encoding, second in (("xor", old), ("overwrite", new)):
        blob = fmt.encode(new, old, encoding)
        region = old.copy()
        fmt.apply(region, blob, encoding, "adler32")
        fmt.apply(region, blob, encoding, "adler32")
        assert region.tolist() == second.tolist(), encoding


def test_checksums_match_published_vectors() -> None:
    assert fmt.checksum("adler32", b"Wikipedia") == "11e60398"  # the example in adler32's description
    assert fmt.checksum("adler32", b"abc") == f"{zlib.adler32(b'abc'):08x}"
    assert len(fmt.checksum("xxh3-128", b"abc")) == 32
    pytest.importorskip("blake3", reason="blake3 is optional: pip install blake3")
    assert fmt.checksum("blake3", b"") == "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"


def test_truncated_xor_delta_raises() -> None:
    old, new = np.zeros(10, np.uint8), np.ones(10, np.uint8)
    blob = fmt.encode(new[:6], old[:6], "xor")
    with pytest.raises(fmt.DeltaError, match="ends after 6 of 10 bytes"):
        fmt.apply(old.copy(), blob, "xor", "xxh3-128")


# --- publisher against the host-side apply ----------------------------------------------------------------------


def weights(step: int) -> dict[str, torch.Tensor]:
    """A small model's weights after `step` updates: `a` (fp32) changes each step, `b` (bf16) every other one."""
    g = torch.Generator().manual_seed(1)
    a, b, c = torch.randn(16, 8, generator=g), torch.randn(40, generator=g).bfloat16(), torch.ones(3)
    a[step % 16] += step
    b[: step // 2] -= 1
    return {"a": a, "b": b, "c": c}


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    base = tmp_path / "hf"
    base.mkdir()
    save_file(weights(0), str(base / "model.safetensors"))
    (base / "config.json").write_text("{}")
    return base


def transport(checkpoint: Path, tmp_path: Path, encoding: str = "xor", mode: str = "delta") -> DeltaDiskTransport:
    """A publisher whose hosts are two local checkpoints pulled in this process (two engines on one host share
    one, so the second pull of each version must find it done)."""
    local = tmp_path / "local"

    def pull(version: int, chain: str) -> list[dict]:
        return [delta_pull.pull(local, checkpoint, tmp_path / "shared", version, chain) for _ in range(2)]

    return DeltaDiskTransport(
        [], 1 << 20, hf_checkpoint=str(checkpoint), disk_dir=str(tmp_path / "shared"), local_dir=str(local),
        mode=mode, encoding=encoding, pull=pull,
    )  # fmt: skip


@pytest.mark.parametrize("encoding", fmt.ENCODINGS)
def test_published_versions_rebuild_the_weights(checkpoint: Path, tmp_path: Path, encoding: str) -> None:
    t = transport(checkpoint, tmp_path, encoding)
    t.connect()
    for step in (1, 2, 3):
        target = t.publish(weights(step).items(), step)
        reports = t.pull(step, t.chain)
        assert reports[0]["applied"] == [step] and reports[1]["applied"] == []  # the second host found it done
        local = load_file(str(tmp_path / "local" / "model.safetensors"))
        assert all(torch.equal(local[k], v) for k, v in weights(step).items())
        index = json.loads((target / fmt.INDEX).read_text())
        assert index["metadata"]["base_version"] == step - 1 and index["metadata"]["delta_encoding"] == encoding
        assert "c" not in index["weight_map"]  # unchanged: not published
        assert ("b" in index["weight_map"]) == (step % 2 == 0)
    assert delta_pull.read_state(tmp_path / "local") == {"chain": t.chain, "version": 3}
    assert (tmp_path / "local" / "config.json").is_file()


def test_out_of_order_delta_is_refused(checkpoint: Path, tmp_path: Path) -> None:
    t = transport(checkpoint, tmp_path)
    t.connect()
    t.publish(weights(1).items(), 1)
    t.publish(weights(2).items(), 2)
    with pytest.raises(fmt.DeltaError, match="out-of-order delta: weight_v000002 builds on version 1"):
        delta_pull.apply_version(tmp_path / "local", fmt.version_dir(tmp_path / "shared", 2))
    t.pull(2, t.chain)  # pulled in order, it applies
    assert torch.equal(load_file(str(tmp_path / "local" / "model.safetensors"))["a"], weights(2)["a"])


def test_checksum_mismatch_raises_then_the_next_pull_rebuilds(checkpoint: Path, tmp_path: Path) -> None:
    t = transport(checkpoint, tmp_path)
    t.connect()
    t.publish(weights(1).items(), 1)
    local_file = tmp_path / "local" / "model.safetensors"
    path, offset, _, _ = fmt.tensor_locations(tmp_path / "local")["a"]
    data = bytearray(local_file.read_bytes())
    data[offset] ^= 0xFF  # the host's base is not what the trainer diffed against
    local_file.write_bytes(bytes(data))
    with pytest.raises(fmt.DeltaError, match="checksum mismatch after applying weight_v000001 .*: a"):
        t.pull(1, t.chain)
    assert delta_pull.read_state(tmp_path / "local") is None
    t.pull(1, t.chain)  # no record: reset from the base, then the delta again
    assert torch.equal(load_file(str(local_file))["a"], weights(1)["a"])


def test_a_full_version_resets_the_chain(checkpoint: Path, tmp_path: Path) -> None:
    full = transport(checkpoint, tmp_path, mode="full")
    full.chain = "c1"
    full.publish(weights(4).items(), 4)
    assert full.pull(4, "c1")[0]["seeded_from"] == 4
    assert torch.equal(load_file(str(tmp_path / "local" / "model-00000.safetensors"))["a"], weights(4)["a"])
    assert not (tmp_path / "local" / "model.safetensors").exists()  # the base's file is gone: a full copy
    with pytest.raises(fmt.DeltaError, match="is missing on this host: --update-weight-disk-dir must be on"):
        full.pull(5, "c1")


def test_a_tensor_the_checkpoint_lacks_is_named(checkpoint: Path, tmp_path: Path) -> None:
    t = transport(checkpoint, tmp_path)
    t.connect()
    with pytest.raises(Exception, match="lm_head.weight is not in --hf-checkpoint"):
        t.publish([("lm_head.weight", torch.zeros(2))], 1)


def test_slime_delta_flags_parse_with_slime_defaults(base: list[str]) -> None:
    from slime_like.arguments import parse_args

    args = parse_args(base + [
        "--update-weight-mode", "delta", "--update-weight-transport", "disk", "--update-weight-disk-dir", "/shared/d",
        "--update-weight-local-checkpoint-dir", "/nvme/ckpt",
    ])  # fmt: skip
    assert (args.update_weight_delta_encoding, args.update_weight_delta_checksum) == ("xor", "xxh3-128")
    assert args.update_weight_disk_dir == "/shared/d" and args.update_weight_local_checkpoint_dir == "/nvme/ckpt"
    with pytest.raises(SystemExit):  # slime refuses it too: colocated updates already move only handles
        parse_args(base + ["--update-weight-mode", "delta", "--update-weight-transport", "disk", "--colocate"])
