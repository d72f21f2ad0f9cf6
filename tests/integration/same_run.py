"""Checks that a resumed run ended where the uninterrupted run ended: metrics, samples and weights.

What may differ, and why: wall-clock metrics; and SGLang's log-probs, which move in their last bits with the shape
of SGLang's batch (up to ~5e-7 on CPU, measured: the same greedy requests sent one by one and eight at a time).
SGLang's seeded sampling (`sampling_seed`, set per sample by rollout/generate.py) needs
--enable-deterministic-inference, which SGLang refuses without a flashinfer/fa3/triton attention backend, so on the
CPU engine (torch_native attention) a sampled rollout is not replayed: these checks need greedy runs (top-k 1).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch


def metrics(out: Path) -> dict[int, dict]:
    """A run's metrics records by step."""
    return {r["step"]: r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


def samples(out: Path, step: int) -> list[dict]:
    """The samples a run dumped for one rollout (--save-debug-rollout-data)."""
    return [json.loads(line) for line in (out / "rollouts" / f"rollout_{step:06d}.jsonl").read_text().splitlines()]


def timing(key: str) -> bool:
    """Wall-clock metrics: they differ between any two runs."""
    return key.startswith(("time/", "perf/")) or key.endswith(("/time", "tokens_per_s"))


def assert_same_metrics(resumed: Path, reference: Path, steps: list[int]) -> None:
    """The resumed run logged exactly `steps`, each metric equal to the reference's within 1e-6 relative (timings
    aside); the train/rollout log-prob mismatch metrics, made of SGLang's log-probs, within 1e-6 absolute."""
    got, want = metrics(resumed), metrics(reference)
    assert sorted(got) == steps
    for step in steps:
        keys = {k for k in got[step].keys() | want[step].keys() if not timing(k)}
        assert {k for k in keys if k not in got[step] or k not in want[step]} == set(), step
        for key in sorted(keys):
            a, b = got[step][key], want[step][key]
            abs_tol = 1e-6 if key.startswith("train/train_rollout_") else 1e-9
            assert math.isclose(a, b, rel_tol=1e-6, abs_tol=abs_tol), (step, key, a, b)


def assert_same_samples(resumed: Path, reference: Path, steps: list[int]) -> None:
    """The same samples (index, prompt, tokens, reward) at each step; SGLang's log-probs within 1e-6."""
    for step in steps:
        a, b = samples(resumed, step), samples(reference, step)
        key = [(s["index"], s["prompt"], s["tokens"], s["reward"]) for s in b]
        assert [(s["index"], s["prompt"], s["tokens"], s["reward"]) for s in a] == key, step
        for x, y in zip(a, b, strict=True):
            assert x["rollout_log_probs"] == pytest.approx(y["rollout_log_probs"], abs=1e-6)


def model_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The model tensors of a torch_dist checkpoint (the distributed optimizer's flat buffers are left out: their
    padding between parameters is uninitialised memory)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    state = _load_state_dict_from_keys(storage_reader=FileSystemReader(str(checkpoint)))
    return {k: v for k, v in state.items() if torch.is_tensor(v) and not k.startswith("optimizer.")}


def assert_same_weights(resumed: Path, reference: Path) -> None:
    """Two checkpoints hold the same model weights (within 1e-6 relative)."""
    got, want = model_weights(resumed), model_weights(reference)
    assert got and got.keys() == want.keys()
    for key in got:
        torch.testing.assert_close(got[key], want[key], rtol=1e-6, atol=1e-9, msg=key)
