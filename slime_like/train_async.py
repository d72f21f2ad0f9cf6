"""Asynchronous loops: training and rollout run at the same time on separate devices (no --colocate).

One step ahead (default): the same phases as `slime_like.train`, with rollout r+1 started before rollout r
trains (so it samples from weights one update older); weights are updated once it has finished.

--fully-async: the engines generate continuously; each step trains the next --rollout-batch-size finished groups
and pushes its weights while generation is paused, not drained (rollout/continuous.py, docs/fully-async.md).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from slime_like.arguments import parse_args

if TYPE_CHECKING:
    from slime_like.run import Run

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> None:
    """Entry point of `python -m slime_like.train_async`."""
    args = parse_args(argv)
    if args.colocate:
        raise SystemExit("train_async needs separate devices for training and rollout: drop --colocate")
    from slime_like.run import Run

    with Run(args) as run:
        on_policy = args.fully_async and args.max_weight_staleness == 0
        no_policy = args.loss_type == "sft_loss" or not run.has_both_sides  # SFT, or no weights move
        if not (on_policy or no_policy or args.use_tis or args.use_mis or args.use_decoupled_loss):
            logger.warning(
                "train_async without an off-policy correction: samples from older weights train uncorrected, "
                "which stopped the learning in our long-tail benchmark (docs/fully-async.md); add --use-tis, "
                "--use-mis or --use-decoupled-loss"
            )
        (fully_async if args.fully_async else one_step_ahead)(run, args)
        run.finish()


def one_step_ahead(run: Run, args: Any) -> None:
    """Rollout r+1 generates while rollout r trains; weights are updated when it has finished."""
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


def fully_async(run: Run, args: Any) -> None:
    """Generation never stops for training: each step takes the next finished batch, trains, and updates the
    weights under the requests still in flight."""
    for rollout_id in range(run.start_rollout, args.num_rollout):
        start = time.monotonic()
        metrics = run.evaluate(rollout_id)
        metrics.update(run.train(rollout_id, run.next_batch(rollout_id)))
        run.save(rollout_id)
        metrics["time/update_weights"] = run.update_weights_in_flight(rollout_id)
        metrics["perf/tokens_trained_per_s"] = metrics["rollout/trained_tokens"] / (time.monotonic() - start)
        run.log(rollout_id, metrics, start)


if __name__ == "__main__":
    main()
