"""Which faster local-spec paths are built (local_kernels_flags.py): auto follows CUDA, TE turns both off."""

from __future__ import annotations

import argparse

import pytest

from slime_like.trainer.megatron.local_kernels_flags import (
    LocalKernels,
    add_local_kernel_arguments,
    choose_local_kernels,
    local_kernels_from_args,
    no_effect_local_kernel_flags,
)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_local_kernel_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(
    ("cuda", "te", "fused", "grouped", "expected"),
    [
        (True, False, "auto", "auto", LocalKernels(True, True)),  # GPU without TE: both by default
        (False, False, "auto", "auto", LocalKernels(False, False)),  # CPU: off unless asked
        (False, False, "on", "auto", LocalKernels(True, False)),
        (False, False, "auto", "on", LocalKernels(False, True)),
        (True, False, "off", "on", LocalKernels(False, True)),
        (True, True, "on", "on", LocalKernels(False, False)),  # TE's own fused modules run instead
    ],
)
def test_choice(cuda: bool, te: bool, fused: str, grouped: str, expected: LocalKernels) -> None:
    assert choose_local_kernels(fused, grouped, cuda=cuda, transformer_engine=te) == expected


def test_flags_parse_and_default_to_auto() -> None:
    assert local_kernels_from_args(_args(), cuda=False, transformer_engine=False) == LocalKernels(False, False)
    assert local_kernels_from_args(_args(), cuda=True, transformer_engine=False) == LocalKernels(True, True)
    on = _args("--local-fused-elementwise", "on", "--local-grouped-experts", "on")
    assert local_kernels_from_args(on, cuda=False, transformer_engine=False) == LocalKernels(True, True)
    # A namespace without the flags (another entry point's parser) counts as auto.
    assert local_kernels_from_args(argparse.Namespace(), cuda=True, transformer_engine=False) == LocalKernels(
        True, True
    )
    with pytest.raises(SystemExit):
        _args("--local-grouped-experts", "yes")


def test_the_three_flags_share_one_scheme_and_group() -> None:
    parser = argparse.ArgumentParser()
    add_local_kernel_arguments(parser)
    (group,) = [g for g in parser._action_groups if "local layer spec" in (g.title or "")]
    flags = [a.option_strings[0] for a in group._group_actions]
    assert flags == ["--local-core-attention", "--local-fused-elementwise", "--local-grouped-experts"]
    assert (
        _args().local_core_attention == "auto"
        and _args("--local-core-attention", "sdpa").local_core_attention == "sdpa"
    )


def test_unknown_value_is_refused_by_flag() -> None:
    with pytest.raises(ValueError, match="--local-fused-elementwise 'fast'"):
        choose_local_kernels("fast", cuda=True, transformer_engine=False)


def test_on_with_transformer_engine_is_named_as_without_effect() -> None:
    on = _args("--local-fused-elementwise", "on", "--local-grouped-experts", "auto")
    assert no_effect_local_kernel_flags(on, transformer_engine=True) == ["--local-fused-elementwise"]
    assert no_effect_local_kernel_flags(on, transformer_engine=False) == []
