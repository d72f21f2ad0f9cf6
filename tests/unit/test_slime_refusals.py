"""slime's flags of round three: --balance-by-flops accepted without effect (named at start); --keep-old-actor,
--release-train and --rollout-external-engine-addrs parsed with slime's meaning, and the combinations that cannot
work refused naming why (their behaviour: tests/megatron/test_keep_old_actor.py,
tests/integration/test_external_engines.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slime_like.arguments import parse_args


def test_balance_by_flops_is_named_without_effect(base: list[str]) -> None:
    from slime_like.trainer.megatron.flags import no_effect_line

    line = no_effect_line(parse_args(base + ["--balance-by-flops"]), transformer_engine=False, cuda=False)
    assert line is not None and "--balance-by-flops" in line.split()[4:]
    assert no_effect_line(parse_args(base), transformer_engine=False, cuda=False) is None


def test_the_three_flags_parse_with_slimes_meaning(base: list[str], tmp_path: Path) -> None:
    args = parse_args(base + ["--keep-old-actor"])
    assert args.keep_old_actor and not parse_args(base).keep_old_actor
    save = ["--save", str(tmp_path / "s"), "--update-weight-transport", "disk"]
    args = parse_args(base + ["--release-train", "--save-interval", "5", *save])
    assert args.release_train and args.save_interval == 1  # as slime: a checkpoint every rollout to rebuild from
    args = parse_args(base + ["--rollout-external-engine-addrs", "10.0.0.1:30000", "http://h:30001"])
    assert args.rollout_external_engine_addrs == ["10.0.0.1:30000", "http://h:30001"]


DISK = ["--save", "/s", "--update-weight-transport", "disk"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--release-train"],
            "--release-train rebuilds the trainer from its checkpoint after each rollout: add --save",
        ),
        (["--release-train", "--save", "/s"], "--release-train needs --update-weight-transport disk"),
        (["--release-train", *DISK, "--keep-old-actor"], "--release-train with --keep-old-actor: not supported"),
        (["--release-train", *DISK, "--advantage-estimator", "ppo"], "--release-train with a PPO critic"),
        (["--rollout-external-engine-addrs", "nohost"], "'nohost': not host:port or http://host:port"),
        (["--rollout-external-engine-addrs", "h:1", "--colocate"], "with --colocate: not supported, the run cannot"),
        (
            ["--rollout-external-engine-addrs", "h:1", "--use-fault-tolerance"],
            "with --use-fault-tolerance: not supported, a server started elsewhere cannot be restarted here",
        ),
        (
            ["--rollout-external-engine-addrs", "h:1", "--update-weight-transport", "tensor"],
            "with --update-weight-transport tensor: not supported",
        ),
    ],
)
def test_combinations_that_cannot_work_say_why(
    base: list[str], capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    with pytest.raises(SystemExit):
        parse_args(base + extra)
    assert message in capsys.readouterr().err
