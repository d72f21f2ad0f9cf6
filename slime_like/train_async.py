"""One-step-ahead asynchronous loop: the next rollout generates while the current one trains.

The same phases as `slime_like.train`; rollout r+1 is started before rollout r trains (so it
samples from weights one update older), and weights are updated once it has finished.
Needs disaggregated placement (no --colocate): training and rollout run at the same time.
"""

from __future__ import annotations

import time

from slime_like.arguments import parse_args


def main(argv: list[str] | None = None) -> None:
    """Entry point of `python -m slime_like.train_async`."""
    args = parse_args(argv)
    if args.colocate:
        raise SystemExit("train_async needs separate devices for training and rollout: drop --colocate")
    from slime_like.run import Run

    with Run(args) as run:
        upcoming = run.generate(run.start_rollout)
        for rollout_id in range(run.start_rollout, args.num_rollout):
            start = time.monotonic()
            metrics = run.evaluate(rollout_id)
            current = upcoming
            run.wait(current, f"rollout {rollout_id} generated")
            if rollout_id + 1 < args.num_rollout:
                upcoming = run.generate(rollout_id + 1)
            metrics.update(run.train(rollout_id, current))
            run.save(rollout_id)
            run.wait(upcoming, f"rollout {rollout_id + 1} generated")  # never update under in-flight requests
            metrics["time/update_weights"] = run.update_weights(rollout_id)
            run.log(rollout_id, metrics, start)
        run.finish()


if __name__ == "__main__":
    main()
