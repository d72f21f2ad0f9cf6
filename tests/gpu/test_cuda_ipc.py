"""The tensor transport's GPU payloads opened in another process, the way SGLang's scheduler opens them.

SGLang's CUDA stack cannot run on the GPU test machine, so the receiving side is reproduced: SGLang's own
decoder when sglang imports (MultiprocessingSerializer.deserialize with its reductions patch, then
FlattenedTensorBucket.reconstruct_tensors), else plain pickle with torch.multiprocessing's reductions (what
SGLang's decoder runs underneath). Either way the tensors must arrive equal, on the GPU, as views of the
sender's memory (no host copy, nothing allocated by the receiver), and a write by the receiver must be seen
by the sender.
"""

from __future__ import annotations

import base64
import importlib
import pickle
import queue
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch


def _sglang_decoder_problem() -> str | None:
    try:
        for module in (
            "sglang.srt.utils.common",
            "sglang.srt.utils.patch_torch",
            "sglang.srt.weight_sync.tensor_bucket",
        ):
            importlib.import_module(module)
    except Exception as exc:  # ImportError, or a CUDA-only dependency failing at import
        return f"sglang's decoder does not import here: {exc!r}"
    return None


def _bucket() -> list[tuple[str, torch.Tensor]]:
    """Mixed dtypes and shapes, one non-contiguous source, as an HF export gives them."""
    g = torch.Generator(device="cuda").manual_seed(0)
    return [
        ("model.layers.0.self_attn.q_proj.weight", torch.randn(64, 32, generator=g, device="cuda").bfloat16()),
        ("model.layers.0.mlp.gate_proj.weight", torch.randn(48, 64, generator=g, device="cuda").t()),
        ("model.norm.weight", torch.randn(7, generator=g, device="cuda", dtype=torch.float16)),
        ("model.embed_tokens.weight", torch.arange(3 * 5 * 2, device="cuda", dtype=torch.int64).view(3, 5, 2)),
    ]


def _decode(payload: str, decoder: str, flattened: bool) -> tuple[list[tuple[str, torch.Tensor]], torch.Tensor | None]:
    """The receiving process: (name, tensor) pairs and, for a flattened bucket, the flat tensor they view."""
    if decoder == "sglang":
        from sglang.srt.utils.common import MultiprocessingSerializer
        from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket, FlattenedTensorMetadata

        monkey_patch_torch_reductions()  # as SGLang's TP worker does before deserializing
        data = MultiprocessingSerializer.deserialize(payload)
        if not flattened:
            return data, None
        metadata = [
            FlattenedTensorMetadata(
                name=m.name, shape=m.shape, dtype=m.dtype, start_idx=m.start_idx, end_idx=m.end_idx, numel=m.numel
            )
            for m in data["metadata"]
        ]
        bucket = FlattenedTensorBucket(flattened_tensor=data["flattened_tensor"], metadata=metadata)
        return bucket.reconstruct_tensors(), data["flattened_tensor"]
    import torch.multiprocessing  # noqa: F401 - the reducers that rebuild CUDA tensors from IPC handles

    data = pickle.loads(base64.b64decode(payload))
    if not flattened:
        return data, None
    flat = data["flattened_tensor"]
    named = [(m.name, flat[m.start_idx : m.end_idx].view(m.dtype).reshape(m.shape)) for m in data["metadata"]]
    return named, flat


def _receiver(payload: str, decoder: str, flattened: bool, out: Any, done: Any) -> None:
    """Child process: open the handles, report what arrived, write through them, wait until the sender looked."""
    try:
        torch.cuda.init()
        allocated = torch.cuda.memory_allocated()
        named, flat = _decode(payload, decoder, flattened)
        report: dict[str, Any] = {
            "names": [n for n, _ in named],
            "devices": [t.device.type for _, t in named],
            "allocated_delta": torch.cuda.memory_allocated() - allocated,
        }
        if flat is not None:
            lo, hi = flat.data_ptr(), flat.data_ptr() + flat.numel()
            report["views_of_flat"] = all(lo <= t.data_ptr() < hi for _, t in named)
        # Copies for the comparison, made after the checks; as bytes, since SGLang's patched reducers (now in
        # this process) cannot pickle CPU tensors.
        report["values"] = [
            (t.dtype, tuple(t.shape), t.cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
            for _, t in named
        ]
        named[0][1].add_(1)  # through the shared memory: the sender must see it
        torch.cuda.synchronize()
        out.put(report)
        done.wait(120)
    except Exception:
        out.put({"error": traceback.format_exc()})


def _round_trip(payload: str, decoder: str, flattened: bool) -> dict[str, Any]:
    ctx = torch.multiprocessing.get_context("spawn")
    out, done = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=_receiver, args=(payload, decoder, flattened, out, done))
    child.start()
    try:
        for _ in range(300):  # the child imports torch (and sglang): allow minutes, but notice if it died
            try:
                report = out.get(timeout=1)
                break
            except queue.Empty:
                assert child.is_alive(), f"the receiving process died (exit code {child.exitcode})"
        else:
            raise AssertionError("the receiving process sent nothing in 300 s")
        assert "error" not in report, report.get("error")
        return report
    finally:
        done.set()  # the sender's tensors stay alive until here
        child.join(60)
        if child.is_alive():
            child.kill()


@contextmanager
def _sender(decoder: str) -> Iterator[None]:
    """This process's tensor reducers as the decoder needs them, restored afterwards.

    With sglang, what TensorTransport does on GPU: SGLang's patch names devices by UUID in the handles. The
    plain decoder needs torch's own reducers, also when an earlier test in this process applied the patch.
    """
    from torch.multiprocessing import reductions

    names = ("reduce_tensor", "rebuild_cuda_tensor", "_reduce_tensor_original", "_rebuild_cuda_tensor_original")
    saved = {n: getattr(reductions, n) for n in names if hasattr(reductions, n)}
    if decoder == "sglang":
        problem = _sglang_decoder_problem()
        if problem:
            pytest.skip(problem)
        from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions

        monkey_patch_torch_reductions()
    elif "_reduce_tensor_original" in saved:
        reductions.reduce_tensor = saved["_reduce_tensor_original"]
    reductions.init_reductions()
    try:
        yield
    finally:
        for name in names:
            if name in saved:
                setattr(reductions, name, saved[name])
            elif hasattr(reductions, name):
                delattr(reductions, name)
        reductions.init_reductions()


def _check(report: dict[str, Any], names: list[str], expected: list[torch.Tensor]) -> None:
    assert report["names"] == names
    assert report["devices"] == ["cuda"] * len(names)
    assert report["allocated_delta"] == 0  # opened in place: the receiver's allocator made nothing
    for name, want, (dtype, shape, data) in zip(names, expected, report["values"], strict=True):
        assert dtype == want.dtype and shape == tuple(want.shape), name
        got = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)
        assert torch.equal(got, want), name


@pytest.mark.parametrize("decoder", ["pickle", "sglang"])
def test_flattened_bucket_round_trip(decoder: str) -> None:
    from slime_like.trainer.weights.base import flat_size, flatten_into
    from slime_like.trainer.weights.tensor import _ALIGN, serialize_bucket

    bucket = _bucket()
    buffer = torch.empty(flat_size(bucket, _ALIGN), dtype=torch.uint8, device="cuda")
    flat, metadata = flatten_into(bucket, buffer, _ALIGN)
    torch.cuda.synchronize()
    expected_write = bucket[0][1] + 1
    with _sender(decoder):
        payload = serialize_bucket(flat, metadata)
    sent = [t.cpu().clone() for _, t in bucket]
    report = _round_trip(payload, decoder, flattened=True)
    _check(report, [n for n, _ in bucket], sent)
    assert report["views_of_flat"]
    first = metadata[0]
    seen = flat[first["start_idx"] : first["end_idx"]].view(first["dtype"]).view(first["shape"])
    assert torch.equal(seen, expected_write)  # the receiver wrote into the sender's buffer


@pytest.mark.parametrize("decoder", ["pickle", "sglang"])
def test_plain_tensors_round_trip(decoder: str) -> None:
    from slime_like.trainer.weights.tensor import serialize_tensors

    bucket = [(name, t.contiguous()) for name, t in _bucket()]
    torch.cuda.synchronize()
    expected_write = bucket[0][1] + 1
    with _sender(decoder):
        payload = serialize_tensors(bucket)
    sent = [t.cpu().clone() for _, t in bucket]  # before the receiver writes into the first one
    report = _round_trip(payload, decoder, flattened=False)
    _check(report, [n for n, _ in bucket], sent)
    assert torch.equal(bucket[0][1], expected_write)
