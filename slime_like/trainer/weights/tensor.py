"""From-tensor transport (colocated servers): weights are shared through memory, HTTP carries only handles.

SGLang's /update_weights_from_tensor takes tensors pickled with torch's multiprocessing reducers, which
send handles instead of bytes; the server maps the memory and loads from it.
- CPU: the exported tensors themselves are sent (most are views of Megatron's parameters). Pickling
  moves a tensor's storage into shared memory in place, once: from the second update on, the servers
  read the trainer's parameters directly, with no copy on the trainer's side. This needs torch's
  "file_system" sharing strategy in this process (with the default one the server's scheduler dies
  with an AuthenticationError).
- GPU: each bucket is copied into one of two alternating buffers and sent as SGLang's "flattened_bucket"
  (one CUDA IPC handle per bucket instead of one per tensor, which is slow to open); the next bucket is
  filled while the servers load the previous one.
"""

from __future__ import annotations

import base64
import io
import types
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing  # noqa: F401 - registers the tensor reducers with ForkingPickler

from rollout import sglang_client as client
from slime_like.trainer.weights.base import NamedTensors, WeightTransport, buckets, flat_size, flatten_into

_ALIGN = 64  # every tensor starts on a cache line in the shared buffer


def _prepare_sharing() -> None:
    """Set up this process to hand tensors to another one (once; both calls are idempotent)."""
    if torch.cuda.is_available():
        # SGLang's reductions name the device by UUID, so the server opens the handle on the right GPU.
        from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions

        monkey_patch_torch_reductions()
    else:
        torch.multiprocessing.set_sharing_strategy("file_system")


def serialize_bucket(flat: torch.Tensor, metadata: list[dict]) -> str:
    """SGLang's flattened-bucket payload for one server TP rank: base64 of the pickled handles."""
    # SimpleNamespace: SGLang reads the metadata by attribute and its safe unpickler admits `types`,
    # so the trainer need not import sglang (10 s) for FlattenedTensorMetadata.
    data = {"flattened_tensor": flat, "metadata": [types.SimpleNamespace(**m) for m in metadata]}
    buf = io.BytesIO()
    ForkingPickler(buf).dump(data)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def serialize_tensors(named: list[tuple[str, torch.Tensor]]) -> str:
    """SGLang's plain payload for one server TP rank: base64 of the pickled (name, tensor) handles."""
    buf = io.BytesIO()
    ForkingPickler(buf).dump([(name, tensor.detach()) for name, tensor in named])
    return base64.b64encode(buf.getvalue()).decode("ascii")


class TensorTransport(WeightTransport):
    """/update_weights_from_tensor with shared-memory (CPU) or CUDA IPC (GPU) handles."""

    name = "tensor"

    def __init__(self, server_urls: list[str], bucket_bytes: int, *, tp_per_server: int = 1, timeout_s: float = 300.0):
        super().__init__(server_urls, bucket_bytes, timeout_s)
        self.tp_per_server = tp_per_server
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
        self._buffers: list[torch.Tensor] = []
        self._seen: set[str] = set()  # names sent by an earlier update
        self._staging: dict[str, torch.Tensor] = {}  # name -> shared tensor for a conversion temporary
        _prepare_sharing()

    def _new_buffer(self, nbytes: int) -> torch.Tensor:
        if self.device is not None:
            return torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return torch.empty(nbytes, dtype=torch.uint8).share_memory_()  # shared once, reused every update

    def _buffer(self, slot: int, nbytes: int) -> torch.Tensor:
        """The slot's reusable buffer, or a one-off one for a bucket larger than --update-weight-buffer-size."""
        if nbytes > self.bucket_bytes + _ALIGN * 1024:
            return self._new_buffer(nbytes)
        while len(self._buffers) <= slot:
            self._buffers.append(self._new_buffer(self.bucket_bytes + _ALIGN * 1024))
        return self._buffers[slot]

    def send(self, named_tensors: NamedTensors, version: int) -> None:
        """Per bucket, POST its handles to every server (on GPU through the alternating flat buffers)."""
        if self.device is not None:
            self._send_flattened(named_tensors)
            return
        with ThreadPoolExecutor(max_workers=len(self.server_urls)) as pool:
            for bucket in buckets(named_tensors, self.bucket_bytes):
                bucket = self._shareable(bucket)
                answers = [
                    pool.submit(client.update_weights_from_tensor, url, *self._handles(bucket), self.timeout_s)
                    for url in self.server_urls
                ]
                for answer in answers:  # the bucket's tensors may be temporaries: keep them until read
                    answer.result()

    def _shareable(self, bucket: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
        """The bucket with conversion temporaries swapped for reused shared copies (CPU).

        A tensor exported as a view of a Megatron parameter keeps its storage, which moves to shared
        memory once. One rebuilt by the conversion (Megatron's interleaved QKV split into q, k, v) is new
        every update: sharing it would create and fault in a fresh shared-memory file each time (~2.5 ms
        per MB, more than the copy), so from the second update on it is copied into a staging tensor. It is
        told apart by its storage not being shared yet (a parameter's stays shared; comparing addresses was
        not enough: the allocator may hand a new temporary the address of the last one).
        """
        out = []
        for name, tensor in bucket:
            if name in self._staging or (name in self._seen and not tensor.is_shared()):
                stage = self._staging.get(name)
                if stage is None or stage.shape != tensor.shape or stage.dtype != tensor.dtype:
                    stage = self._staging[name] = torch.empty(tensor.shape, dtype=tensor.dtype).share_memory_()
                tensor = stage.copy_(tensor)
            self._seen.add(name)
            out.append((name, tensor))
        return out

    def _send_flattened(self, named_tensors: NamedTensors) -> None:
        """Per bucket: fill a device buffer, POST its handle to every server; two buckets in flight."""
        in_flight: list[tuple[list[Future], torch.Tensor | None]] = [([], None), ([], None)]
        with ThreadPoolExecutor(max_workers=2 * len(self.server_urls)) as pool:
            for i, bucket in enumerate(buckets(named_tensors, self.bucket_bytes)):
                slot = i % 2
                for answer in in_flight[slot][0]:  # the servers are done reading this buffer
                    answer.result()
                buffer = self._buffer(slot, flat_size(bucket, _ALIGN))
                flat, metadata = flatten_into(bucket, buffer, _ALIGN)
                torch.cuda.current_stream().synchronize()  # the copies land before a server reads
                answers = [
                    pool.submit(client.update_weights_from_tensor, url, *self._handles(flat, metadata), self.timeout_s)
                    for url in self.server_urls
                ]
                in_flight[slot] = (answers, buffer)  # keeps a one-off buffer alive until answered
            for answers, _ in in_flight:
                for answer in answers:
                    answer.result()

    def _handles(self, bucket_or_flat, metadata: list[dict] | None = None) -> tuple[list[str], str | None]:
        """What one server is sent: its handles once per TP rank, and their load format.

        Each pickled handle counts one reference to the shared memory and each receiver releases one, so
        every receiver needs its own (one handle read twice would let the memory be unlinked too early).
        """
        if metadata is None:
            serialize, load_format = (lambda: serialize_tensors(bucket_or_flat)), None
        else:
            serialize, load_format = (lambda: serialize_bucket(bucket_or_flat, metadata)), "flattened_bucket"
        return [serialize() for _ in range(self.tp_per_server)], load_format

    def close(self) -> None:
        """Free the shared buffers."""
        self._buffers.clear()
        self._staging.clear()
        self._seen.clear()
