"""Benchmark of the rollout -> trainer data path: bytes each trainer rank receives, driver peak memory.

    .venv/bin/python scripts/bench/bench_data_path.py                       # 1024 samples x 8192 tokens, DP 1 2 4
    .venv/bin/python scripts/bench/bench_data_path.py --samples 256 --tokens 2048 --dp 1 2
    .venv/bin/python scripts/bench/bench_data_path.py --samples 1024 --tokens 64 --response-tokens 48 --paths by-ref

Prints figures, asserts nothing. On a simulated cluster (tools/simulated_cluster.py: real raylets on this machine,
all on 127.0.0.1) a rollout-side actor on the head node (where the rollout manager runs) makes a synthetic
rollout of Samples (--samples x --tokens, --response-tokens of them a response with SGLang log-probs), and DP
stand-in trainer ranks, one per worker node, take it as the trainer does. Two paths:

- `by-ref` (the project's): the rollout side keeps the samples and hands the driver metrics and one object ref
  per DP rank (rollout/train_handoff.py: build_train_data, shape_rewards for grpo, split_by_dp, one ray.put per
  rank); each rank is handed the ref of its own share, as TrainGroup.train does, and fetches it from the head
  node's object store. The share's bytes are also reported exactly, with those of what it holds about the whole
  rollout beyond its own rows (`rollout`: pickled).
- `whole` (the path before): the driver gets the samples, builds the training data, puts it once, and every rank
  fetches all of it; then each rank's old log-probs reached every other rank through all_gather_object (that part
  is not run here: its bytes are counted, 4 per response token of the other ranks' shares, pickle overhead aside).

Each (path, DP) runs in a fresh driver process (its peak RSS is the driver figure). The stand-in ranks do not
train: they fetch what they are handed and report its size (the object store's size of the object, i.e. what
crosses the network to their node) and that they hold it. The figure to read is bytes per rank x DP / the whole:
1.0 means per-rank bytes fall as 1/DP.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import tools.simulated_cluster as simulated_cluster  # noqa: E402

MiB = 1 << 20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the benchmark."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=1024)
    p.add_argument("--tokens", type=int, default=8192, help="tokens per sample (prompt + response)")
    p.add_argument("--response-tokens", type=int, default=7680)
    p.add_argument("--n-samples-per-prompt", type=int, default=8)
    p.add_argument("--global-batch-size", type=int, default=None, help="default: the whole rollout in one step")
    p.add_argument("--dp", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--paths", nargs="+", default=["by-ref", "whole"], choices=["by-ref", "whole"])
    p.add_argument("--object-store-mib", type=int, default=1536, help="per simulated node")
    p.add_argument("--driver", nargs=2, metavar=("PATH", "DP"), help=argparse.SUPPRESS)  # one driver run
    return p.parse_args(argv)


def synthetic_groups(samples: int, tokens: int, response: int, per_prompt: int) -> list[list[Any]]:
    """Groups of finished Samples with rewards and SGLang log-probs (lengths vary a little, as real ones do)."""
    import random

    from slime_like.core.sample import Sample, Status

    rng = random.Random(0)
    groups = []
    for g in range(samples // per_prompt):
        group = []
        for j in range(per_prompt):
            n = response - rng.randrange(0, max(1, response // 8))
            prompt = tokens - response
            sample = Sample(prompt=f"p{g}", index=g * per_prompt + j, group_index=g)
            sample.tokens = [rng.randrange(151_000) for _ in range(prompt + n)]
            sample.response_length = n
            sample.loss_mask = [1] * n
            sample.rollout_log_probs = [-rng.random() for _ in range(n)]
            sample.reward = float(rng.random() < 0.5)
            sample.status = Status.COMPLETED
            group.append(sample)
        groups.append(group)
    return groups


def rollout_side_cls():
    """The rollout side: a Ray actor on the head node holding a synthetic rollout."""
    import ray

    @ray.remote(num_cpus=0)
    class RolloutSide:
        def __init__(self, shape: tuple[int, int, int, int]) -> None:
            self.groups = synthetic_groups(*shape)

        def by_ref(self, dp: int, global_batch_size: int) -> Any:
            """The project's handoff: metrics, a failure summary and one ref per DP rank."""
            from buffer.group_rewards import RewardShaping
            from rollout.train_handoff import TrainLayout, hand_off

            layout = TrainLayout(dp, 1, global_batch_size)
            return hand_off(0, self.groups, {"rollout/samples": 1}, layout, None, shaping=RewardShaping("grpo"))

        def samples(self) -> list[list[Any]]:
            """The path before: the samples themselves go to the driver."""
            return self.groups

        def peak_rss_mib(self) -> float:
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    return RolloutSide


def rank_cls():
    """A stand-in trainer rank: takes what it is handed, says how big it is."""
    import ray

    @ray.remote(num_cpus=0)
    class Rank:
        def take(self, data: Any, dp_rank: int) -> dict[str, Any]:
            import pickle

            share = hasattr(data, "rows")
            rows = len(data.rows) if share else len(data)
            tokens = sum(len(t) for t in (data.data.tokens if share else data.tokens))
            rollout = len(pickle.dumps(data.rollout)) if share else 0  # what a share holds of the whole rollout
            node = ray.get_runtime_context().get_node_id()
            return {"rows": rows, "tokens": tokens, "rollout_bytes": rollout, "node": node}

        def node(self) -> str:
            return ray.get_runtime_context().get_node_id()

    return Rank


def driver(path: str, dp: int, args: argparse.Namespace) -> dict[str, Any]:
    """One driver process: the rollout handed to `dp` ranks by `path`; its figures."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR", log_to_driver=False)
    nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0)
    head = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) == 0)
    on = lambda node: {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}  # noqa: E731
    shape = (args.samples, args.tokens, args.response_tokens, args.n_samples_per_prompt)
    side = rollout_side_cls().options(**on(head)).remote(shape)
    ranks = [rank_cls().options(**on(nodes[r % len(nodes)])).remote() for r in range(dp)]
    ray.get([r.node.remote() for r in ranks] + [side.peak_rss_mib.remote()])
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    gbs = args.global_batch_size or args.samples
    start = time.monotonic()
    if path == "by-ref":
        result = ray.get(side.by_ref.remote(dp, gbs))
        refs = result.shares
        taken = ray.get([rank.take.remote(refs[d], d) for d, rank in enumerate(ranks)])
        sizes = [_object_size(ref) for ref in refs]
        gathered = [0] * dp
    else:
        from buffer.train_data import build_train_data, split_by_dp

        groups = ray.get(side.samples.remote())
        data = build_train_data(groups)
        del groups
        ref = ray.put(data)
        taken = ray.get([rank.take.remote(ref, d) for d, rank in enumerate(ranks)])
        sizes = [_object_size(ref)] * dp
        # all_gather_object of the old log-probs: every rank receives the other ranks' (float32, 4 B/token).
        responses = [sum(s.data.response_lengths) for s in split_by_dp(data, dp, gbs)]
        gathered = [4 * (sum(responses) - mine) for mine in responses]
        del data
    seconds = time.monotonic() - start
    return {
        "path": path,
        "dp": dp,
        "bytes_per_rank": sizes,
        "gathered_per_rank": gathered,
        "rows_per_rank": [t["rows"] for t in taken],
        "rollout_bytes_per_rank": [t["rollout_bytes"] for t in taken],
        "tokens_per_rank": [t["tokens"] for t in taken],
        "rank_nodes_distinct": len({t["node"] for t in taken}),
        "driver_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "driver_rss_before_mib": base_rss,
        "rollout_side_peak_rss_mib": ray.get(side.peak_rss_mib.remote()),
        "seconds": seconds,
    }


def _object_size(ref: Any) -> int:
    """The object store's size of an object (what a node fetching it receives)."""
    import ray

    return int(ray.experimental.get_object_locations([ref])[ref]["object_size"])


def main(argv: list[str] | None = None) -> None:
    """Run every (path, DP) in its own driver process on one simulated cluster; print the figures."""
    args = parse_args(argv)
    if args.driver:
        print("RESULT " + json.dumps(driver(args.driver[0], int(args.driver[1]), args)), flush=True)
        return
    os.environ["PYTHONPATH"] = str(REPO)  # the raylets' workers import the project
    simulated_cluster.NODE = {**simulated_cluster.NODE, "object_store_memory": args.object_store_mib * MiB}
    cluster, _ = simulated_cluster.start_cluster([1] * max(args.dp))
    env = {**os.environ, **simulated_cluster.RAY_ENV, "RAY_ADDRESS": cluster.address, "PYTHONPATH": str(REPO)}
    env["OMP_NUM_THREADS"] = "1"
    results = []
    try:
        for path in args.paths:
            for dp in args.dp:
                cmd = [sys.executable, __file__, *(argv or sys.argv[1:]), "--driver", path, str(dp)]
                out = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=1800)
                line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
                if out.returncode or line is None:
                    raise SystemExit(f"driver {path} DP={dp} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
                results.append(json.loads(line[len("RESULT ") :]))
                print(f"  {path} DP={dp}: done in {results[-1]['seconds']:.1f} s", flush=True)
    finally:
        cluster.shutdown()
    report(results, args)


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """The table: per-rank bytes (max over ranks), their ratio to 1/DP of the whole, driver peak memory."""
    print(
        f"\nrollout: {args.samples} samples x {args.tokens} tokens ({args.response_tokens} response, up to 1/8 "
        f"shorter), {args.n_samples_per_prompt} per prompt; simulated cluster, one rank per worker node\n"
    )
    whole = {r["dp"]: r for r in results if r["path"] == "whole"}
    head = "| path | DP | MiB per rank (max) | bytes per rank | of the whole rollout, B | x DP / whole |"
    print(head + " +log-probs gathered MiB | rows per rank | driver peak MiB | rollout side peak MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        total = max(whole[r["dp"]]["bytes_per_rank"]) if r["dp"] in whole else sum(r["bytes_per_rank"])
        most = max(r["bytes_per_rank"])
        print(
            f"| {r['path']} | {r['dp']} | {most / MiB:.1f} | {r['bytes_per_rank']} | {r['rollout_bytes_per_rank']} | "
            f"{most * r['dp'] / total:.3f} | {max(r['gathered_per_rank']) / MiB:.1f} | {r['rows_per_rank']} | "
            f"{r['driver_peak_rss_mib']:.0f} | {r['rollout_side_peak_rss_mib']:.0f} |"
        )
    spread = {(r["path"], r["dp"]): r["rank_nodes_distinct"] for r in results}
    print(f"\ndistinct nodes holding the ranks' data, by (path, DP): {spread}")
    ref = {r["dp"]: r for r in results if r["path"] == "by-ref"}
    if 1 in ref:
        print("\nby-ref bytes per rank vs DP=1 (1/DP is the goal):")
        for dp, r in sorted(ref.items()):
            ratio = max(r["bytes_per_rank"]) / max(ref[1]["bytes_per_rank"])
            print(f"  DP={dp}: {ratio:.3f} (1/DP = {1 / dp:.3f})")


if __name__ == "__main__":
    main()
