"""Which torch attention path runs for which device / Transformer Engine / flag / feature combination, the call-by-call
fallback (varlen -> flex -> sdpa), and the errors for asks that cannot work; the flag reaches make_bridge's overrides."""

from __future__ import annotations

import argparse

import pytest
import torch

from slime_like.trainer.megatron.flags import add_training_arguments, model_config_overrides
from slime_like.trainer.megatron.torch_attention import choose_attention, runnable_path


@pytest.mark.parametrize(
    ("requested", "cuda", "te", "expected"),
    [
        (None, True, False, "varlen"),  # CUDA without TE: torch's varlen by default
        ("auto", True, False, "varlen"),
        ("auto", False, False, None),  # the CPU keeps Megatron's local attention
        ("auto", True, True, None),  # TE present: its attention
        ("off", True, False, None),
        ("flex", False, False, "flex"),  # asked for on the CPU
        ("sdpa", False, False, "sdpa"),
        ("flex", True, False, "flex"),
        ("sdpa", True, False, "sdpa"),
    ],
)
def test_choice_by_device_te_and_flag(requested, cuda, te, expected) -> None:
    assert choose_attention(requested, cuda=cuda, transformer_engine=te) == expected


def test_features_move_auto_to_a_path_that_has_them() -> None:
    # Dropout runs only on SDPA; softmax offsets and own-attention specs (DSA) on no torch path: Megatron's stays.
    assert choose_attention("auto", cuda=True, transformer_engine=False, dropout=0.1) == "sdpa"
    assert choose_attention("sdpa", cuda=False, transformer_engine=False, dropout=0.1) == "sdpa"
    assert choose_attention("auto", cuda=True, transformer_engine=False, softmax_type="learnable") is None
    assert choose_attention("auto", cuda=True, transformer_engine=False, own_spec=True) is None


@pytest.mark.parametrize(
    ("requested", "kwargs", "message"),
    [
        ("varlen", {"cuda": False, "transformer_engine": False}, "varlen_attn is Flash Attention, CUDA only"),
        ("flex", {"cuda": True, "transformer_engine": True}, "Transformer Engine is installed"),
        ("flex", {"cuda": True, "transformer_engine": False, "dropout": 0.1}, "dropout 0.1 runs only on the sdpa"),
        ("varlen", {"cuda": True, "transformer_engine": False, "dropout": 0.1}, "dropout"),
        ("sdpa", {"cuda": True, "transformer_engine": False, "softmax_type": "off-by-one"}, "softmax_type"),
        ("sdpa", {"cuda": False, "transformer_engine": False, "own_spec": True}, "its own layer spec"),
        ("fast", {"cuda": True, "transformer_engine": False}, "choose one of auto, varlen, flex, sdpa, off"),
    ],
)
def test_impossible_asks_name_the_flag(requested, kwargs, message) -> None:
    with pytest.raises(ValueError, match="--local-core-attention") as error:
        choose_attention(requested, **kwargs)
    assert message in str(error.value)


def test_each_call_falls_back_to_a_path_that_runs_it() -> None:
    q = torch.zeros(8, 4, 16)
    v32 = torch.zeros(8, 2, 32)
    # On the CPU varlen (CUDA Flash Attention) is never runnable: flex next, which has no backward here.
    assert runnable_path("varlen", q, q, dropout=0.0) == "flex"
    assert runnable_path("flex", q, v32, dropout=0.0) == "flex"  # flex takes a value head size of its own
    grad_q = q.clone().requires_grad_()
    assert runnable_path("flex", grad_q, q, dropout=0.0) == "sdpa"
    with torch.no_grad():
        assert runnable_path("flex", grad_q, q, dropout=0.0) == "flex"
    assert runnable_path("varlen", q, q, dropout=0.1) == "sdpa"
    assert runnable_path("sdpa", q, q, dropout=0.0) == "sdpa"


def test_flag_reaches_the_bridge_overrides_only_when_set() -> None:
    parser = argparse.ArgumentParser()
    add_training_arguments(parser)
    parser.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    default = parser.parse_args([])
    assert default.local_core_attention == "auto"
    assert "torch_attention" not in model_config_overrides(default, transformer_engine=False, cuda=True)
    flex = parser.parse_args(["--local-core-attention", "flex"])
    assert model_config_overrides(flex, transformer_engine=False, cuda=False)["torch_attention"] == "flex"
    with pytest.raises(SystemExit):
        parser.parse_args(["--local-core-attention", "fast"])
    with pytest.raises(SystemExit):  # the name before the --local-* scheme: renamed, not kept
        parser.parse_args(["--attention-backend-torch", "flex"])
