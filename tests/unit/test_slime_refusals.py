"""slime's flags of round three that stay without slime's meaning: --balance-by-flops accepted without effect (named
at start), and the refusals that say precisely what is missing."""

from __future__ import annotations

import pytest

from slime_like.arguments import parse_args


def test_balance_by_flops_is_named_without_effect(base: list[str]) -> None:
    from slime_like.trainer.megatron.flags import no_effect_line

    line = no_effect_line(parse_args(base + ["--balance-by-flops"]), transformer_engine=False, cuda=False)
    assert line is not None and "--balance-by-flops" in line.split()[4:]
    assert no_effect_line(parse_args(base), transformer_engine=False, cuda=False) is None


@pytest.mark.parametrize(
    ("flag", "missing"),
    [
        ("--keep-old-actor", "keeps the weights that generated each rollout on the trainer"),
        ("--release-train", "kills the trainer's Megatron actors during each rollout and rebuilds them"),
        ("--rollout-external-engine-addrs", "discovering pre-launched SGLang servers"),
    ],
)
def test_refusals_say_what_is_missing(
    base: list[str], capsys: pytest.CaptureFixture[str], flag: str, missing: str
) -> None:
    with pytest.raises(SystemExit):
        parse_args(base + [flag, "x"] if flag.endswith("addrs") else base + [flag])
    err = capsys.readouterr().err
    assert f"{flag} is not supported here: not implemented: " in err and missing in err
