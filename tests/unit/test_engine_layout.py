"""How engines are cut from placement slots and what each node's SGLang process is started with."""

from __future__ import annotations

import pytest

from rollout.engines import EngineLaunch, base_gpu_id, split_by_node
from slime_like.core.cluster import Slot
from slime_like.core.errors import EngineError
from slime_like.placement import Placement


def slot(node: str, gpu: int | None = None, bundle: int = 0) -> Slot:
    return Slot(None, bundle, node, f"10.0.0.{ord(node[0]) % 200}", gpu)  # type: ignore[arg-type]


def launch(**extra: object) -> EngineLaunch:
    return EngineLaunch("/m", "bfloat16", "cuda", tp=16, extra_args=["--mem-fraction-static", "0.7"], log_dir="/l",
                        startup_timeout=60, **extra)  # fmt: skip


def test_a_one_node_engine_has_no_node_flags() -> None:
    assert launch(base_gpu_id=4).server_args() == [
        "--tp-size", "16", "--base-gpu-id", "4", "--mem-fraction-static", "0.7",
    ]  # fmt: skip


def test_a_two_node_engine_names_its_rank_and_rendezvous() -> None:
    args = launch(nnodes=2, node_rank=1, dist_init_addr="10.0.0.3:24001", base_gpu_id=0).server_args()
    assert args == [
        "--tp-size", "16", "--base-gpu-id", "0", "--nnodes", "2", "--node-rank", "1",
        "--dist-init-addr", "10.0.0.3:24001", "--mem-fraction-static", "0.7",
    ]  # fmt: skip


def test_an_engine_is_cut_where_its_node_changes() -> None:
    slots = [slot("a", 0), slot("a", 1), slot("b", 0), slot("b", 1)]
    assert [[s.node_id for s in part] for part in split_by_node(slots)] == [["a", "a"], ["b", "b"]]


def test_an_engine_coming_back_to_a_node_is_refused() -> None:
    with pytest.raises(EngineError, match="come back to a node"):
        split_by_node([slot("a"), slot("b"), slot("a")])


def test_sglang_takes_consecutive_gpus_from_the_base() -> None:
    assert base_gpu_id([slot("a", 2), slot("a", 3)]) == 2
    assert base_gpu_id([slot("a"), slot("a")]) is None  # CPU slots
    with pytest.raises(EngineError, match=r"got GPUs \[1, 3\], not consecutive"):
        base_gpu_id([slot("a", 1), slot("a", 3)])


def test_rollout_slots_are_cut_into_engines_in_order() -> None:
    rollout = [slot("a", g, b) for b, g in enumerate(range(4))] + [slot("b", g, 4 + g) for g in range(4)]
    placement = Placement([], rollout, False, True, {}, "head")
    engines = placement.engine_slots(4)
    assert [[(s.node_id, s.gpu) for s in e] for e in engines] == [
        [("a", 0), ("a", 1), ("a", 2), ("a", 3)],
        [("b", 0), ("b", 1), ("b", 2), ("b", 3)],
    ]
    assert len(placement.engine_slots(8)) == 1 and len(placement.engine_slots(2)) == 4


def test_the_placement_lines_name_each_node_and_what_it_holds() -> None:
    trainer = [slot("t", 0, 0), slot("t", 1, 1)]
    placement = Placement(trainer, [slot("e", 0, 2)], False, True, {}, "head")
    lines = placement.describe([{"url": "http://10.0.0.1:20001", "nodes": ["e"], "pids": [1]}])
    assert lines == [
        "  node 10.0.0.116/t: trainer ranks 0-1",
        "  node 10.0.0.101/e: engine 0 (http://10.0.0.1:20001)",
        "  node ?/head: driver, rollout manager, router",
    ]
