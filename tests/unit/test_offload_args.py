"""--offload-train: its default, its contradictions, and the documented no-op without CUDA."""

from __future__ import annotations

import argparse
import importlib.util
import logging

import pytest
import torch

from slime_like.arguments import parse_args, resolve_offload_train
from slime_like.core.errors import ArgumentError
from slime_like.trainer.megatron.offload import TrainerOffload

CUDA = torch.cuda.is_available()
HAVE_SAVER = importlib.util.find_spec("torch_memory_saver") is not None
cpu_only = pytest.mark.skipif(CUDA, reason="checks the behaviour without CUDA")


def test_off_without_colocate(base: list[str]) -> None:
    assert parse_args(base).offload_train is False


@cpu_only
def test_colocate_default_follows_cuda(base: list[str]) -> None:
    # On by default only with --colocate AND CUDA: this machine has no CUDA.
    assert parse_args(base + ["--colocate"]).offload_train is False


def test_colocate_default_on_cuda_needs_the_saver() -> None:
    args = argparse.Namespace(offload_train=None, colocate=True)
    if HAVE_SAVER:
        resolve_offload_train(args, cuda=True)
        assert args.offload_train is True
        return
    with pytest.raises(ArgumentError, match=r"pip install torch_memory_saver.*--no-offload-train"):
        resolve_offload_train(args, cuda=True)


def test_explicit_no_offload_on_cuda_needs_nothing() -> None:
    args = argparse.Namespace(offload_train=False, colocate=True)
    resolve_offload_train(args, cuda=True)
    assert args.offload_train is False


@cpu_only
def test_cpu_accepts_the_flag(base: list[str]) -> None:
    assert parse_args(base + ["--colocate", "--offload-train"]).offload_train is True
    assert parse_args(base + ["--colocate", "--no-offload-train"]).offload_train is False


def test_offload_needs_colocate(base: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(base + ["--offload-train"])
    assert "--offload-train frees the trainer's GPU memory for colocated servers: it needs --colocate" in (
        capsys.readouterr().err
    )


@cpu_only
def test_cpu_offload_does_nothing_and_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="slime_like.trainer.megatron.offload"):
        memory = TrainerOffload(True)
        with memory.region():
            weights = torch.ones(1000)
        accounting = [memory.offload(), memory.onload(), memory.offload()]
    assert memory.enabled is False and memory.offloaded is False
    assert accounting == [{}, {}, {}]
    assert weights.sum().item() == 1000.0  # the region changed nothing about where tensors live
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "no CUDA here, nothing to offload" in lines[0]


def test_not_requested_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="slime_like.trainer.megatron.offload"):
        memory = TrainerOffload(False)
        assert memory.offload() == {} and memory.onload() == {}
    assert memory.enabled is False and not caplog.records
