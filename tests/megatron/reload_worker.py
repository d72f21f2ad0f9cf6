"""torchrun worker (2 gloo ranks): reloadable process groups keep working, as the same objects, after a rebuild.

Usage: torchrun --nproc_per_node 2 tests/megatron/reload_worker.py groups OUT.pt
       torchrun --nproc_per_node 2 tests/megatron/reload_worker.py megatron OUT.pt HF_DIR
"groups" checks collectives and rank queries on hand-made groups before and after destroy + reload; "megatron"
trains 2 steps, rebuilds Megatron's groups, trains 2 more, then trains 4 steps with plain groups for reference.
Rank 0 saves the results.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist


def _collectives(group: dist.ProcessGroup, ranks: list[int]) -> dict:
    """all_reduce, all_gather, broadcast, reduce_scatter_tensor and barrier on `group`; what each gave."""
    me = dist.get_rank(group)
    n = dist.get_world_size(group)
    out = {"rank": me, "size": n, "ranks": dist.get_process_group_ranks(group), "backend": dist.get_backend(group)}
    t = torch.full((4,), float(dist.get_rank() + 1))
    dist.all_reduce(t, group=group)
    out["all_reduce"] = t.tolist()
    parts = [torch.zeros(2) for _ in range(n)]
    dist.all_gather(parts, torch.full((2,), float(dist.get_rank())), group=group)
    out["all_gather"] = [p.tolist() for p in parts]
    b = torch.full((3,), float(dist.get_rank() + 10))
    dist.broadcast(b, src=ranks[-1], group=group)
    out["broadcast"] = b.tolist()
    rs = torch.zeros(2)
    dist.reduce_scatter_tensor(rs, torch.arange(2.0 * n) * (dist.get_rank() + 1), group=group)
    out["reduce_scatter"] = rs.tolist()
    gathered = torch.zeros(2 * n)
    dist.all_gather_into_tensor(gathered, torch.full((2,), float(dist.get_rank())), group=group)
    out["all_gather_into_tensor"] = gathered.tolist()
    if n == 2:  # point to point: each rank sends its rank to the other
        got = torch.zeros(1)
        peer = ranks[1 - me]
        if me == 0:
            dist.send(torch.tensor([float(dist.get_rank())]), dst=peer, group=group)
            dist.recv(got, src=peer, group=group)
        else:
            dist.recv(got, src=peer, group=group)
            dist.send(torch.tensor([float(dist.get_rank())]), dst=peer, group=group)
        out["recv"] = got.tolist()
    dist.barrier(group=group)
    return out


def groups(out: str) -> None:
    from slime_like.trainer.megatron.reloadable_groups import (
        ReloadableProcessGroup,
        destroy_reloadable_groups,
        enable_reloadable_groups,
        reload_reloadable_groups,
    )

    dist.init_process_group("gloo")
    with enable_reloadable_groups():
        both = dist.new_group([0, 1])
        mine = [dist.new_group([r]) for r in (0, 1)]  # each rank is outside one of them
        side = dist.new_group([0, 1], backend="gloo")  # another backend asked for explicitly: left plain
    own = mine[dist.get_rank()]
    assert isinstance(both, ReloadableProcessGroup) and isinstance(own, ReloadableProcessGroup)
    assert mine[1 - dist.get_rank()] is dist.GroupMember.NON_GROUP_MEMBER
    assert type(side) is dist.ProcessGroup
    results = {"before": [_collectives(both, [0, 1]), _collectives(own, [dist.get_rank()])]}
    first_inner = both.inner
    results["destroyed"] = destroy_reloadable_groups()
    try:
        dist.all_reduce(torch.zeros(1), group=both)
    except (RuntimeError, ValueError) as err:  # c10d's logging wrapper may re-raise it as a ValueError
        results["while_destroyed"] = repr(err)
    results["reloaded"] = reload_reloadable_groups()
    assert both.inner is not first_inner
    results["after"] = [_collectives(both, [0, 1]), _collectives(own, [dist.get_rank()])]
    _collectives(side, [0, 1])
    gathered = [None, None]
    dist.all_gather_object(gathered, results, group=both)
    if dist.get_rank() == 0:
        torch.save(gathered, out)
    dist.destroy_process_group()


def megatron(out: str, hf_dir: str) -> None:
    from megatron.core import parallel_state as mpu

    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.optimizer import OptimizerSettings
    from slime_like.trainer.megatron.parallel import init_parallel
    from slime_like.trainer.megatron.reloadable_groups import (
        ReloadableProcessGroup,
        destroy_reloadable_groups,
        reload_reloadable_groups,
    )
    from tests.megatron.common import MAX_TOKENS, fixed_batch, num_targets, token_ce_loss

    seqs = fixed_batch()
    loss = token_ce_loss(num_targets(seqs))

    def build() -> MegatronTrainEngine:
        settings = OptimizerSettings(lr=1e-3, weight_decay=0.01, clip_grad=1.0)
        return MegatronTrainEngine(hf_dir, settings, max_tokens_per_micro_batch=MAX_TOKENS)

    def steps(engine: MegatronTrainEngine, n: int) -> list[dict]:
        return [engine.train_step(seqs, [None] * len(seqs), loss) for _ in range(n)]

    results = {}
    init_parallel(tp=1, pp=1, seed=1234, reloadable_groups=True)
    assert mpu.get_data_parallel_world_size() == 2
    dp_group = mpu.get_data_parallel_group()
    assert isinstance(dp_group, ReloadableProcessGroup)
    engine = build()
    metrics = steps(engine, 2)
    results["destroyed"] = destroy_reloadable_groups()
    results["reloaded"] = reload_reloadable_groups()
    assert mpu.get_data_parallel_group() is dp_group
    metrics += steps(engine, 2)
    results["reloadable"] = metrics
    del engine
    mpu.destroy_model_parallel()
    dist.barrier()

    init_parallel(tp=1, pp=1, seed=1234)
    assert not isinstance(mpu.get_data_parallel_group(), ReloadableProcessGroup)
    results["plain"] = steps(build(), 4)
    mpu.destroy_model_parallel()
    if dist.get_rank() == 0:
        torch.save(results, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "groups":
        groups(sys.argv[2])
    else:
        megatron(sys.argv[2], sys.argv[3])
