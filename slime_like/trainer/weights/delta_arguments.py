"""slime's flags of disk and delta weight sync, and their checks (read at argument parsing: no torch here)."""

from __future__ import annotations

import argparse
import importlib.util

from slime_like.core.errors import ArgumentError


def add_delta_arguments(group: argparse._ArgumentGroup) -> None:
    """--update-weight-disk-dir, --update-weight-local-checkpoint-dir, the delta encoding/checksum, the post-write
    hook (as slime names them; --update-weight-mode is beside --update-weight-transport)."""
    group.add_argument(
        "--update-weight-disk-dir",
        default=None,
        help="directory on a filesystem the trainer and every rollout host share, where --update-weight-transport "
        "disk publishes each version as weight_vNNNNNN/ (delta mode: the changed tensors only; default for full "
        "disk sync: --output-dir/weights)",
    )
    group.add_argument(
        "--update-weight-local-checkpoint-dir",
        default=None,
        help="directory on each rollout host (e.g. local NVMe) holding a full HF checkpoint kept at the latest "
        "version: seeded from the engine's model path, patched in place by each delta (a published full version "
        "replaces it); the engines reload from it. Required by --update-weight-mode delta",
    )
    group.add_argument(
        "--update-weight-delta-encoding",
        default="xor",
        choices=["xor", "overwrite"],
        help="xor: new ^ old, smallest and fastest, applied exactly once on the right base; overwrite: changed "
        "positions and their values, larger, applying it again changes nothing",
    )
    group.add_argument(
        "--update-weight-delta-checksum",
        default="xxh3-128",
        choices=["xxh3-128", "blake3", "adler32"],
        help="per-tensor checksum of the new weights, checked on every host after the apply (blake3 needs "
        "`pip install blake3`)",
    )
    group.add_argument(
        "--custom-update-weight-post-write-path",
        default=None,
        help="function hook(args, version_dir, server_urls) called after a disk version is written, before the "
        "engines read it (e.g. to publish writes on an object-store mount); slime passes its engine actors third",
    )


def validate_delta_args(args: argparse.Namespace) -> None:
    """Reject disk/delta weight-sync settings that cannot work, naming the flag and the fix."""
    local = args.update_weight_local_checkpoint_dir
    if args.update_weight_mode == "delta":
        if args.update_weight_transport != "disk":
            _error(
                f"--update-weight-mode delta publishes on a shared disk: it needs --update-weight-transport disk, "
                f"not {args.update_weight_transport}"
            )
        if getattr(args, "colocate", False):
            _error(
                "--update-weight-mode delta is not supported with --colocate: colocated engines take the weights "
                "through memory handles (--update-weight-transport tensor), which a delta cannot make cheaper"
            )
        if getattr(args, "lora_rank", 0):
            _error("--update-weight-mode delta with --lora-rank: a LoRA update already sends the adapter alone")
        if not args.update_weight_disk_dir:
            _error("--update-weight-mode delta needs --update-weight-disk-dir (a directory every rollout host sees)")
        if not local:
            _error("--update-weight-mode delta needs --update-weight-local-checkpoint-dir (a directory on each host)")
        if args.update_weight_delta_checksum == "blake3" and importlib.util.find_spec("blake3") is None:
            _error("--update-weight-delta-checksum blake3 needs the blake3 package: `pip install blake3`")
    if local and args.update_weight_transport != "disk":
        _error(
            f"--update-weight-local-checkpoint-dir is where engines reload disk versions from: it needs "
            f"--update-weight-transport disk, not {args.update_weight_transport}"
        )
    if args.custom_update_weight_post_write_path:
        from slime_like.core.errors import PluginError
        from slime_like.core.plugin_loader import load_plugin

        try:
            path = args.custom_update_weight_post_write_path
            load_plugin(path, "--custom-update-weight-post-write-path", params=3, is_async=False)
        except PluginError as exc:
            _error(str(exc))


def _error(message: str) -> None:
    raise ArgumentError(message)
