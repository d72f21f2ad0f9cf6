"""Defaults slime's users rely on, each as slime's own arguments.py sets it."""

from __future__ import annotations

from slime_like.arguments import parse_args


def test_distributed_timeout_is_slimes_ten_minutes(base: list[str]) -> None:
    # slime/utils/arguments.py: reset_arg(parser, "--distributed-timeout-minutes", type=int, default=10)
    assert parse_args(base).distributed_timeout_minutes == 10
    assert parse_args(base + ["--distributed-timeout-minutes", "3"]).distributed_timeout_minutes == 3
