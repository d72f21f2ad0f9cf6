"""A multi-node Ray cluster simulated on one machine: real raylets, every node on 127.0.0.1.

    .venv/bin/python tools/simulated_cluster.py --nodes 2 1 1      # head plus three workers; prints RAY_ADDRESS

Then, in another shell, `RAY_ADDRESS=<printed> RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE=disabled
python -m slime_like.train ...` places the job across the nodes. Ctrl-C stops the cluster.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

# Keep Ray on loopback for every node and driver (without the first, Ray swaps 127.0.0.1 for the interface
# address and a driver cannot reach the GCS), and let separate driver processes connect.
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
NODE = {"node_ip_address": "127.0.0.1", "object_store_memory": 200 << 20}


def start_cluster(worker_cpus: list[int], system_config: dict[str, Any] | None = None) -> tuple[Any, list[Any]]:
    """A head without CPUs (drivers and light actors only) and one worker node per entry, with that many CPUs;
    returns the Cluster and its worker nodes. Sets RAY_ENV in this process's environment. `system_config`: Ray's
    internal settings for the whole cluster (e.g. how often the head checks each node's health)."""
    os.environ.update(RAY_ENV)
    import ray
    from ray.cluster_utils import Cluster

    ray._private.ray_constants.ENABLE_RAY_CLUSTER = False  # read at import: maybe before the line above
    head = {"num_cpus": 0, "include_dashboard": False, **NODE}
    if system_config:
        head["_system_config"] = system_config
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        workers = [cluster.add_node(num_cpus=n, **NODE) for n in worker_cpus]
        cluster.wait_for_nodes()
    except BaseException:
        cluster.shutdown()
        raise
    return cluster, workers


def main(argv: list[str] | None = None) -> None:
    """Start the cluster, print its address, keep it up until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 1, 1], help="CPUs of each worker node")
    args = parser.parse_args(argv)
    cluster, workers = start_cluster(args.nodes)
    print(f"RAY_ADDRESS={cluster.address}", flush=True)
    for node, cpus in zip(workers, args.nodes, strict=True):
        print(f"  worker {node.node_id[:8]}: {cpus} CPU(s)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main()
