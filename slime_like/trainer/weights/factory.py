"""The trainer's weight updater from its flags: --update-weight-transport, its fallback and retries (LoRA: adapters)."""

from __future__ import annotations

import os
from typing import Any

from slime_like.trainer.weights.updater import WeightUpdater


def make_updater(
    args: Any,
    server_urls: list[str],
    kind: str,
    output_dir: str,
    lora: Any = None,
    multi_lora: bool = False,
    master_addr: str = "127.0.0.1",
    rank: int = 0,
) -> WeightUpdater:
    """A WeightUpdater with `kind` as the transport and the --update-weight-fallback one behind it (with `lora`, the
    model's LoRA settings, the adapter's transport alone)."""
    from slime_like.trainer.weights.disk import DiskTransport
    from slime_like.trainer.weights.distributed import DistributedTransport
    from slime_like.trainer.weights.tensor import TensorTransport

    size, timeout, tp = args.update_weight_buffer_size, args.update_weight_timeout, args.rollout_num_gpus_per_engine
    if lora is not None:  # no full-weight fallback: it would replace the base the adapter is for
        from slime_like.trainer.weights.lora import LoraTransport, MultiLoraTransport

        directory = os.path.join(output_dir, "lora")
        # multi-LoRA: each adapter under its name, from lora/<name>/v<N>/
        kind_class = MultiLoraTransport if multi_lora else LoraTransport
        factory = {"lora": lambda: kind_class(server_urls, lora, args.hf_checkpoint, directory, timeout_s=timeout)}
        return WeightUpdater(factory, "lora", None, args.update_weight_retries, rank)
    disk_dir = args.update_weight_disk_dir or os.path.join(output_dir, "weights")
    factories = {
        # Rank 0's node address (MASTER_ADDR): engines on other nodes join the weight group there.
        "distributed": lambda: DistributedTransport(
            server_urls, size, tp_per_server=tp, master_address=master_addr, timeout_s=timeout
        ),
        "tensor": lambda: TensorTransport(server_urls, size, tp_per_server=tp, timeout_s=timeout),
        "disk": lambda: DiskTransport(
            server_urls, size, args.hf_checkpoint, disk_dir, timeout, args.update_weight_disk_keep_files
        ),
    }
    # The engines keep the tensors an in-place update leaves out (frozen ones: megatron/frozen_weights.py); a disk
    # version is a whole checkpoint the engines load, except a delta's (a tensor left out is one that did not change).
    in_place = {"distributed", "tensor"}
    if args.update_weight_local_checkpoint_dir:  # delta, or full versions pulled to host-local disks
        from slime_like.trainer.weights.delta import make_delta_transport

        factories["disk"] = lambda: make_delta_transport(args, server_urls, disk_dir)
        if args.update_weight_mode == "delta":
            in_place.add("disk")
    fallback = None if args.update_weight_fallback == "none" else args.update_weight_fallback
    return WeightUpdater(factories, kind, fallback, args.update_weight_retries, rank, in_place=in_place)
