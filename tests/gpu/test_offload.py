"""--offload-train on one GPU (a world of one, NCCL): a Megatron engine built inside the region leaves the GPU,
comes back bit-identical, then trains, and the NCCL groups it trains with, destroyed at each offload and rebuilt
at each onload, still work."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

GIB = 1024**3


@pytest.fixture(scope="module")
def saver() -> None:
    pytest.importorskip(
        "torch_memory_saver", reason="torch_memory_saver is not installed: pip install torch_memory_saver"
    )


@pytest.fixture(scope="module")
def mid_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~55M-parameter Qwen3 (hidden 1024, 4 layers): about 1 GiB of bf16 weights, fp32 grads and Adam state."""
    from tests.conftest import _make_tiny

    return _make_tiny(
        tmp_path_factory,
        "qwen3",
        hidden_size=1024,
        ffn_hidden_size=3072,
        num_layers=4,
        num_heads=16,
        num_kv_heads=8,
        tie_word_embeddings=False,
    )


def _resident_bytes(engine) -> int:
    """Bytes of the distinct CUDA storages behind weights, gradient buffers, main params and Adam states."""
    storages: dict[int, int] = {}

    def add(t) -> None:
        if torch.is_tensor(t) and t.is_cuda:
            storage = t.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()

    for chunk in engine.model:
        for p in chunk.parameters():
            add(p)
            add(getattr(p, "main_grad", None))
    for part in getattr(engine.optimizer, "chained_optimizers", [engine.optimizer]):
        for group in part.optimizer.param_groups:
            for p in group["params"]:
                add(p)
                for value in part.optimizer.state[p].values():
                    add(value)
    return sum(storages.values())


def _host_copy(engine) -> list[torch.Tensor]:
    """Weights, main params and Adam states, copied to the host in a fixed order."""
    out = [p.detach().cpu().clone() for chunk in engine.model for p in chunk.parameters()]
    for part in getattr(engine.optimizer, "chained_optimizers", [engine.optimizer]):
        for group in part.optimizer.param_groups:
            for p in group["params"]:
                out.append(p.detach().cpu().clone())
                state = part.optimizer.state[p]
                out.extend(state[k].detach().cpu().clone() for k in sorted(state) if torch.is_tensor(state[k]))
    return out


def _all_reduce_works() -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu

    for group in (None, mpu.get_data_parallel_group(), mpu.get_tensor_model_parallel_group()):
        t = torch.full((8,), 3.0, device="cuda")
        dist.all_reduce(t, group=group)
        torch.cuda.synchronize()
        assert t.tolist() == [3.0 * dist.get_world_size(group)] * 8


def test_offload_frees_memory_and_onload_restores_it_bit_identically(saver: None, mid_qwen3: Path) -> None:
    import torch.distributed as dist

    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.offload import TrainerOffload, materialize_optimizer_state
    from slime_like.trainer.megatron.optimizer import OptimizerSettings
    from slime_like.trainer.megatron.parallel import init_parallel
    from slime_like.trainer.megatron.reloadable_groups import reloadable_groups
    from tests.megatron.common import fixed_batch, num_targets, token_ce_loss

    init_parallel(tp=1, pp=1, seed=1234, reloadable_groups=True)
    assert dist.get_backend() == "nccl"
    memory = TrainerOffload(True, rebuild_groups=True)
    assert memory.enabled and memory.rebuild_groups and reloadable_groups()
    with memory.region():
        engine = MegatronTrainEngine(
            mid_qwen3, OptimizerSettings(lr=1e-4), max_tokens_per_micro_batch=4096, dtype=torch.bfloat16
        )
        assert materialize_optimizer_state(engine.optimizer) > 0
    expected = _resident_bytes(engine)
    assert expected > 0.5 * GIB, f"the test model is too small to measure ({expected / GIB:.2f} GiB)"
    _all_reduce_works()  # the NCCL communicators exist before the first pause

    # Right after the build: weights, gradient buffers and the materialised Adam states all leave the GPU.
    torch.cuda.empty_cache()  # what offload() frees must be the region's, not the allocator's cache
    first = memory.offload()
    assert first["memory/offload_moved_gib"] * GIB >= 0.9 * expected, (first, expected / GIB)
    assert memory.offload() == {}  # already offloaded
    with pytest.raises(RuntimeError, match="onload"), memory.region():
        pass
    memory.onload()

    seqs = fixed_batch(json.loads((mid_qwen3 / "config.json").read_text())["vocab_size"])
    loss = token_ce_loss(num_targets(seqs))
    step = engine.train_step(seqs, [None] * len(seqs), loss)
    assert step["update_successful"] == 1.0
    before = _host_copy(engine)
    torch.cuda.empty_cache()
    off = memory.offload()
    assert off["memory/offload_moved_gib"] * GIB >= 0.9 * expected, (off, expected / GIB)
    assert all(group.inner is None for group in reloadable_groups())  # the communicators are gone
    on = memory.onload()
    assert all(group.inner is not None for group in reloadable_groups())
    assert on["memory/onload_moved_gib"] * GIB >= 0.9 * expected, (on, expected / GIB)
    after = _host_copy(engine)
    assert len(before) == len(after)
    assert all(torch.equal(x, y) for x, y in zip(before, after, strict=True))

    # Training and the NCCL groups it uses work after onload.
    _all_reduce_works()
    step = engine.train_step(seqs, [None] * len(seqs), loss)
    assert step["update_successful"] == 1.0 and math.isfinite(step["loss"]) and step["grad_norm"] > 0
    moved = [p.detach().cpu() for chunk in engine.model for p in chunk.parameters()]
    assert any(not torch.equal(x, y) for x, y in zip(before, moved, strict=False))
