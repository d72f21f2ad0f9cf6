"""slime flags this engine cannot honour: parsed, then refused at once with a message naming the flag and why."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any


class Refused(argparse.Action):
    """An argparse action that stops the parse with `why` as soon as its flag is given (any values)."""

    def __init__(self, option_strings: list[str], dest: str, why: str = "", **kwargs: Any) -> None:
        kwargs.setdefault("nargs", "*")
        kwargs.setdefault("default", argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)
        self.why = why

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        """Stop with the flag's reason (argparse's usage error, exit status 2)."""
        parser.error(f"{option_string} is not supported here: {self.why}")


def add_refused(group: Any, flag: str, why: str) -> None:
    """Add `flag` to `group` as a slime flag that is refused, with `why` as the reason given at start."""
    group.add_argument(flag, action=Refused, why=why, help=f"slime's flag, refused here: {why}")
