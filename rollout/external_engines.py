"""slime's --rollout-external-engine-addrs: generate on SGLang servers started outside the run.

As slime (slime/backends/sglang_utils/external.py): the run starts no engine and reserves no rollout devices; it
reads each server's /get_server_info (its tensor/pipeline parallel sizes), puts its own router in front of them
(rollout/fleet.py's `attach`), treats them as the policy's engines (weight updates go to them, with the run's
transport) and never stops them.

The secret: the run's servers and router demand the run's secret (slime_like/core/secret.py), and every call from
the run carries it. A server started without `--api-key` ignores it; one started with its own key must be given
that key as the run's secret, by exporting SLIME_LIKE_API_KEY=<that key> before the run starts (then the router
demands it too). A server that refuses the run's key (401/403 on /get_server_info) stops the start-up with that advice.

Not with external servers (each refused at start, naming why): --colocate (the run cannot release or resume memory
of servers it does not own), --sglang-config (its own engine lifecycle; slime makes them exclusive too),
--use-fault-tolerance (a dead server cannot be restarted from here), --update-weight-transport tensor (shared
memory with servers the run did not place on its node) and --update-weight-local-checkpoint-dir (its pulls run in
the engines' own Ray actors on each host).
"""

from __future__ import annotations

import argparse
import logging
from typing import Any
from urllib.parse import urlsplit

from rollout import sglang_client as client
from slime_like.core.errors import ArgumentError, EngineError
from slime_like.core.secret import API_KEY_ENV

logger = logging.getLogger(__name__)

FLAG = "--rollout-external-engine-addrs"


def add_external_engine_arguments(group: argparse._ArgumentGroup) -> None:
    """slime's --rollout-external-engine-addrs."""
    group.add_argument(
        FLAG,
        nargs="+",
        default=None,
        metavar="HOST:PORT",
        help="generate on these pre-launched SGLang servers (host:port or http://host:port) instead of starting "
        "engines: the run puts its router in front of them and sends them the weight updates; a server started "
        f"with --api-key needs that key exported as {API_KEY_ENV} (rollout/external_engines.py)",
    )


def validate_external_engine_args(args: argparse.Namespace) -> None:
    """Check the addresses' form and the flags that cannot go with servers started elsewhere."""
    addrs = getattr(args, "rollout_external_engine_addrs", None)
    if addrs is None:
        return
    for addr in addrs:
        normalize(addr)
    clashes = [
        ("--colocate", args.colocate, "the run cannot release and resume the memory of servers it does not own"),
        ("--sglang-config", getattr(args, "sglang_config", None), "it starts and owns its engines (slime: exclusive)"),
        ("--use-fault-tolerance", args.use_fault_tolerance, "a server started elsewhere cannot be restarted here"),
        (
            "--update-weight-transport tensor",
            "tensor" in (args.update_weight_transport, getattr(args, "update_weight_fallback", None)),
            "it hands tensors over in shared memory to engines the run placed on its own node; use distributed "
            "(or disk on a filesystem the servers see)",
        ),
        (
            "--update-weight-local-checkpoint-dir",
            getattr(args, "update_weight_local_checkpoint_dir", None),
            "its pulls run in the engines' own Ray actors on every host",
        ),
    ]
    for flag, given, why in clashes:
        if given:
            raise ArgumentError(f"{FLAG} with {flag}: not supported, {why}")


def normalize(addr: str) -> str:
    """`host:port` or `http://host:port` as a base URL (slime's normalize_external_engine_addr)."""
    url = (addr if "://" in addr else f"http://{addr}").rstrip("/")
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise ArgumentError(f"{FLAG} {addr!r}: not host:port or http://host:port (IPv6 in brackets)")
    return url


def discover(addrs: list[str], timeout: float = 30.0) -> list[dict[str, Any]]:
    """Each server's URL and /get_server_info, once it answers /health; EngineError naming the address and the fix
    when one does not answer, or refuses the run's secret."""
    found = []
    for addr in addrs:
        url = normalize(addr)
        problem = client.health_problem(url, timeout)
        if problem is not None:
            raise EngineError(
                f"{FLAG}: {url} does not answer /health ({problem}); start the SGLang server there first "
                "(python -m sglang.launch_server ... --host H --port P), or fix the address"
            )
        try:
            info = client.get(url, "/get_server_info", timeout)
        except EngineError as exc:
            raise EngineError(
                f"{FLAG}: {exc}. A server started with its own --api-key needs that key exported as {API_KEY_ENV} "
                "before the run starts (the run and its router then use it)"
            ) from None
        found.append({"url": url, "info": info})
    return found


def engine_shape(found: list[dict[str, Any]]) -> tuple[int, int]:
    """(GPUs per engine, GPUs of all engines) from the servers' info (tp x pp, as slime counts them); one TP size
    for all, since the weight transports send each engine's shards alike."""
    sizes = {}
    for server in found:
        info = server["info"]
        tp = int(info.get("tp_size") or info.get("tensor_parallel_size") or 1)
        pp = int(info.get("pp_size") or info.get("pipeline_parallel_size") or 1)
        sizes[server["url"]] = (tp, tp * pp)
    if len({tp for tp, _ in sizes.values()}) > 1:
        raise EngineError(f"{FLAG}: the servers run different tensor-parallel sizes {sizes}: give servers of one size")
    return next(iter(sizes.values()))[1], sum(n for _, n in sizes.values())


def attach_external_engines(args: Any) -> list[str] | None:
    """The servers' URLs after checking each one (None without the flag, or with --debug-train-only, which needs
    no server); sets the engine shape on `args` as slime does (--rollout-num-gpus-per-engine, --rollout-num-gpus)."""
    addrs = getattr(args, "rollout_external_engine_addrs", None)
    if not addrs or getattr(args, "debug_train_only", False):
        return None
    found = discover(addrs, timeout=getattr(args, "rollout_health_check_timeout", 30.0) or 30.0)
    args.rollout_num_gpus_per_engine, args.rollout_num_gpus = engine_shape(found)
    for server in found:
        info = server["info"]
        logger.info("external SGLang engine %s: model %s, tp %s", server["url"], info.get("model_path"),
                    info.get("tp_size"))  # fmt: skip
    return [server["url"] for server in found]
