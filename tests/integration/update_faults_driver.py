"""slime_like.train's loop with the weight-update transport chosen per version: UPDATE_FAULT_TRANSPORTS="1:tensor,
4:distributed" updates versions 1-3 over tensor and 4 on over distributed (before version 1: the run's flag). So one
run (one start-up) takes the engine kills of tests/integration/test_update_faults.py in every full-weight transport.

    python -m tests.integration.update_faults_driver <slime_like.train's flags>
"""

from __future__ import annotations

import os
import sys
import time

from slime_like.arguments import parse_args


def transport_at(version: int, plan: str, default: str) -> str:
    """The transport `plan` ("version:transport,...", ascending) names for `version`."""
    chosen = default
    for item in plan.split(","):
        start, _, kind = item.partition(":")
        if item and version >= int(start):
            chosen = kind
    return chosen


def main() -> None:
    """Generate, train, update weights: as slime_like/train.py, the transport switched per UPDATE_FAULT_TRANSPORTS."""
    args = parse_args(sys.argv[1:])
    from slime_like.run import Run

    plan, default = os.environ.get("UPDATE_FAULT_TRANSPORTS", ""), args.update_weight_transport
    with Run(args) as run:
        for rollout_id in range(run.start_rollout, args.num_rollout):
            start = time.monotonic()
            metrics = run.train(rollout_id, run.generate(rollout_id))
            run.args.update_weight_transport = transport_at(rollout_id + 1, plan, default)
            metrics["time/update_weights"] = run.update_weights(rollout_id)
            run.log(rollout_id, metrics, start)
        run.finish()


if __name__ == "__main__":
    main()
