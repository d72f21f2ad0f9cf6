"""The on-disk format of delta weight sync (slime's `--update-weight-mode delta`): encodings, checksums, headers.

A tensor is handled as its raw bytes (uint8, dtype-blind). Two encodings of the change from `old` to `new`:
- xor: the bytes `new ^ old` (unchanged bytes are zeros, which zstd shrinks to almost nothing); applying it
  twice reverts it, so it must be applied exactly once, on the right base.
- overwrite: the changed byte positions and their new values; applying it again changes nothing.
Both are zstd-compressed at level 1. Each version records a checksum of every changed tensor's new bytes.
The trainer encodes (slime_like/trainer/weights/delta.py); every engine host decodes (rollout/delta_pull.py).
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

ENCODINGS = ("xor", "overwrite")
CHECKSUMS = ("xxh3-128", "blake3", "adler32")
COMPRESSION = "zstd"
ZSTD_LEVEL = 1
INDEX = "model.safetensors.index.json"
_CHUNK = 2 << 20  # xor is applied in 2 MiB blocks: decompressed, xored and hashed while in cache


class DeltaError(RuntimeError):
    """A delta that cannot be applied: wrong base, wrong order, a checksum mismatch, a missing file."""


class _Adler32:
    """zlib's adler32 behind the update/hexdigest interface of the hash objects."""

    def __init__(self) -> None:
        self.value = 1

    def update(self, data: Any) -> None:
        self.value = zlib.adler32(data, self.value)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


def hasher(algorithm: str) -> Any:
    """A fresh incremental hasher for `algorithm` (one of CHECKSUMS)."""
    if algorithm == "xxh3-128":
        import xxhash

        return xxhash.xxh3_128()
    if algorithm == "blake3":
        try:
            import blake3
        except ImportError as exc:
            raise DeltaError(
                "--update-weight-delta-checksum blake3 needs the blake3 package: `pip install blake3` on the "
                "trainer and every rollout host, or use xxh3-128 (the default)"
            ) from exc
        return blake3.blake3()
    if algorithm == "adler32":
        return _Adler32()
    raise DeltaError(f"unknown delta checksum {algorithm!r}: one of {', '.join(CHECKSUMS)}")


def checksum(algorithm: str, data: Any) -> str:
    """The hex digest of a bytes-like object."""
    h = hasher(algorithm)
    h.update(data)
    return h.hexdigest()


def _positions_dtype(nbytes: int) -> str:
    return "<u4" if nbytes < 2**32 else "<u8"


def encode(new: np.ndarray, old: np.ndarray, encoding: str) -> bytes | None:
    """The compressed change from `old` to `new` (flat uint8 arrays of one length); None when nothing changed."""
    if new.shape != old.shape:
        raise DeltaError(f"a delta needs tensors of one size: {new.size} bytes against {old.size}")
    if encoding == "xor":
        diff = np.bitwise_xor(new, old)
        if not diff.any():
            return None
        payload = diff
    elif encoding == "overwrite":
        changed = np.flatnonzero(new != old)
        if changed.size == 0:
            return None
        count = np.array([changed.size], "<u8").view(np.uint8)
        payload = np.concatenate([count, changed.astype(_positions_dtype(new.size)).view(np.uint8), new[changed]])
    else:
        raise DeltaError(f"unknown delta encoding {encoding!r}: one of {', '.join(ENCODINGS)}")
    return zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(payload.tobytes())


def apply(region: np.ndarray, compressed: bytes, encoding: str, algorithm: str) -> str:
    """Apply one tensor's delta to `region` (its flat, writable uint8 bytes) in place; the checksum of the result."""
    nbytes = region.size
    h = hasher(algorithm)
    if encoding == "xor":
        reader = zstandard.ZstdDecompressor().stream_reader(compressed)
        pos = 0
        while pos < nbytes:
            block = reader.read(min(_CHUNK, nbytes - pos))
            if not block:
                raise DeltaError(f"an xor delta ends after {pos} of {nbytes} bytes")
            view = region[pos : pos + len(block)]
            np.bitwise_xor(view, np.frombuffer(block, np.uint8), out=view)
            h.update(view)
            pos += len(block)
        if reader.read(1):
            raise DeltaError(f"an xor delta is longer than its tensor ({nbytes} bytes)")
        return h.hexdigest()
    if encoding == "overwrite":
        payload = np.frombuffer(zstandard.ZstdDecompressor().decompress(compressed), np.uint8)
        count = int(payload[:8].view("<u8")[0])
        width = np.dtype(_positions_dtype(nbytes)).itemsize
        end = 8 + count * width
        if payload.size != end + count:
            raise DeltaError(f"an overwrite delta of {count} positions has {payload.size} bytes, not {end + count}")
        positions = payload[8:end].view(_positions_dtype(nbytes))
        if count and int(positions.max()) >= nbytes:
            raise DeltaError(f"an overwrite delta writes past its tensor ({nbytes} bytes)")
        region[positions] = payload[end:]
        h.update(region)
        return h.hexdigest()
    raise DeltaError(f"unknown delta encoding {encoding!r}: one of {', '.join(ENCODINGS)}")


def safetensors_header(path: Path) -> tuple[dict[str, Any], int]:
    """A safetensors file's header (name -> dtype, shape, data_offsets; `__metadata__`) and where its data starts."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length)), 8 + length


def tensor_locations(checkpoint: Path) -> dict[str, tuple[Path, int, int, dict[str, Any]]]:
    """Every tensor of an HF safetensors checkpoint: name -> (file, byte offset, byte count, header entry)."""
    found = {}
    for path in sorted(Path(checkpoint).glob("*.safetensors")):
        header, start = safetensors_header(path)
        for name, info in header.items():
            if name != "__metadata__":
                begin, end = info["data_offsets"]
                found[name] = (path, start + begin, end - begin, info)
    return found


def read_index(version_dir: Path) -> dict[str, Any]:
    """A published version's index metadata ({} for a full checkpoint without an index)."""
    path = Path(version_dir) / INDEX
    if not Path(version_dir).is_dir():
        raise DeltaError(
            f"published weight version {version_dir} is missing on this host: --update-weight-disk-dir must be on a "
            "filesystem the trainer and every rollout host share"
        )
    if not path.is_file():
        return {}
    return json.loads(path.read_text()).get("metadata", {})


def is_delta(metadata: dict[str, Any]) -> bool:
    """Whether a version is a delta (its index names an encoding) rather than a full checkpoint."""
    return "delta_encoding" in metadata


def version_dir(source: Path | str, version: int) -> Path:
    """`<source>/weight_v{version:06d}` (slime's name for a published version)."""
    return Path(source) / f"weight_v{version:06d}"
