"""Synchronous RL loop: generate -> train -> save -> update weights, one rollout after another."""

from __future__ import annotations

import time

from slime_like.arguments import parse_args


def main(argv: list[str] | None = None) -> None:
    """Entry point of `python -m slime_like.train`."""
    args = parse_args(argv)  # before any heavy import: --help and argument errors are instant
    if args.fully_async:
        raise SystemExit("--fully-async needs the asynchronous loop: python -m slime_like.train_async --fully-async")
    from slime_like.run import Run

    with Run(args) as run:
        for rollout_id in range(run.start_rollout, args.num_rollout):
            start = time.monotonic()
            metrics = run.evaluate(rollout_id)
            metrics.update(run.train(rollout_id, run.generate(rollout_id)))
            run.save(rollout_id)
            metrics["time/update_weights"] = run.update_weights(rollout_id)
            run.log(rollout_id, metrics, start)
        run.finish()


if __name__ == "__main__":
    main()
