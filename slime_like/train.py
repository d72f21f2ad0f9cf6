"""Synchronous RL loop: generate -> train -> save -> update weights, one rollout after another."""

from __future__ import annotations

import logging
import time

from slime_like.arguments import parse_args


def main(argv: list[str] | None = None) -> None:
    """Entry point of `python -m slime_like.train`."""
    args = parse_args(argv)  # before any heavy import: --help and argument errors are instant
    if args.fully_async:
        raise SystemExit("--fully-async needs the asynchronous loop: python -m slime_like.train_async --fully-async")
    from slime_like.run import Run

    with Run(args) as run:
        if args.keep_old_actor:  # slime's queue is made for the one-step-ahead loop (slime_like/trainer/old_actor.py)
            logging.getLogger(__name__).warning(
                "--keep-old-actor in the synchronous loop: as in slime, each rollout's old log-probs come from the "
                "weights one update older than the ones that generated it (train_async is the loop it fits)"
            )
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
