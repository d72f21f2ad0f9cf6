"""Routing replay's pieces: SGLang's routed-experts layout on a Sample and in the train data, alignment with the packed
micro-batch a router sees (packing, padding, sequence and context parallel), recording cut back into sequences, and
the two flags."""

from __future__ import annotations

import base64
import json
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest
import torch

from buffer.train_data import build_train_data
from slime_like.core import slime_finder
from slime_like.core.sample import ROUTED_EXPERTS_KEY, Status, decode_routed_experts
from slime_like.trainer.megatron.packing import pack
from slime_like.trainer.megatron.routing_replay import align, assemble, filler, local_positions, router_order

slime_finder.install()
from slime.utils.types import Sample  # noqa: E402  (ours with slime's append_response_tokens)

LAYERS, TOPK, EXPERTS = 3, 2, 8


def encoded(array: np.ndarray) -> str:
    """As SGLang sends it: base64 of the int32 bytes."""
    return base64.b64encode(array.astype(np.int32).tobytes()).decode()


def routing_for(n_tokens: int, seed: int) -> np.ndarray:
    """Distinct top-2 experts per token and layer, [n_tokens - 1, LAYERS, TOPK]."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(EXPERTS)[:TOPK] for _ in range((n_tokens - 1) * LAYERS)]).reshape(
        n_tokens - 1, LAYERS, TOPK
    )


def test_decode_checks_the_layout() -> None:
    want = routing_for(6, 0)
    assert (decode_routed_experts(encoded(want), 5, LAYERS, TOPK) == want).all()
    with pytest.raises(ValueError, match="5 tokens x 3 layers x top-2 need 30"):
        decode_routed_experts(encoded(want[:4]), 5, LAYERS, TOPK)


def test_append_response_tokens_keeps_the_latest_answers_routing_across_a_continuation() -> None:
    args = Namespace(num_layers=LAYERS, moe_router_topk=TOPK)
    sample = Sample(tokens=[1, 2, 3], index=0)
    first = routing_for(5, 1)  # prompt 3 + 2 new tokens: 4 rows
    meta = {"finish_reason": {"type": "abort"}, ROUTED_EXPERTS_KEY: encoded(first)}
    sample.append_response_tokens(args, tokens=[4, 5], log_probs=[-1.0, -1.0], meta_info=meta)
    assert sample.rollout_routed_experts.shape == (4, LAYERS, TOPK) and sample.status == Status.ABORTED
    # The continuation sent all 5 tokens: its answer covers them and its 2 new tokens (6 rows), and replaces.
    second = np.concatenate([first, routing_for(3, 2)])
    meta = {"finish_reason": {"type": "stop"}, ROUTED_EXPERTS_KEY: encoded(second)}
    sample.append_response_tokens(args, tokens=[6, 7], log_probs=[-1.0, -1.0], meta_info=meta)
    assert (sample.rollout_routed_experts == second).all()
    # Tool tokens get no routing; the train data refuses a sample whose routing misses tokens.
    sample.append_response_tokens(args, tokens=[8], trainable=False)
    sample.reward = 1.0
    with pytest.raises(ValueError, match=r"need \[7, layers, topk\]"):
        build_train_data([[sample]])
    # JSON-friendly (buffer state, debug dumps) and back.
    back = Sample.from_dict(json.loads(json.dumps(sample.to_dict())))
    assert (np.asarray(back.rollout_routed_experts) == second).all()


def test_train_data_carries_routing_only_when_present() -> None:
    plain = Sample(tokens=[1, 2, 3], response_length=1, reward=1.0, status=Status.COMPLETED, index=0)
    assert build_train_data([[plain]]).rollout_routed_experts == []
    routed = Sample(tokens=[1, 2, 3, 4], response_length=2, reward=0.0, status=Status.COMPLETED, index=1)
    routed.rollout_routed_experts = routing_for(4, 3).tolist()  # as from_dict leaves it
    data = build_train_data([[plain, routed]])
    assert data.rollout_routed_experts[0] is None and data.rollout_routed_experts[1].dtype == np.int32
    assert data.select([1]).rollout_routed_experts[0].shape == (3, LAYERS, TOPK)


@pytest.mark.parametrize("layout", ["packed", "thd", "padded"])
def test_align_puts_each_sequence_on_its_positions(layout: str) -> None:
    lengths = [5, 3, 4]
    sequences = [torch.arange(n) + 10 * i for i, n in enumerate(lengths)]
    routing = [torch.as_tensor(routing_for(n, i)) for i, n in enumerate(lengths)]
    mb = pack(sequences, [0, 2], layout, multiple=4)  # "thd": each padded to 4 (5 -> 8)
    full = align(mb, routing, LAYERS, TOPK, EXPERTS)
    assert full.shape == (*mb.tokens.shape, LAYERS, TOPK)
    for idx, row, start, n in zip(mb.indices, mb.rows, mb.starts, mb.lengths, strict=True):
        assert torch.equal(full[row, start : start + n - 1], routing[idx].long())  # token t: its experts
        assert torch.equal(mb.tokens[row, start : start + n], sequences[idx])  # ...on the row where token t is
    # Everything else (last tokens, padding) has distinct filler experts in range.
    assert ((full >= 0) & (full < EXPERTS)).all() and (full[..., 0] != full[..., 1]).all()


def test_router_order_follows_megatrons_flattening_and_shards() -> None:
    values = torch.arange(2 * 8).reshape(2, 8, 1)  # [rows, T, 1]: value = row * 8 + position
    # Megatron's [s, b] flattening: position-major, rows interleaved.
    assert router_order(values, torch.arange(8))[:4, 0].tolist() == [0, 8, 1, 9]
    one_row = pack([torch.arange(8), torch.arange(4)], [0, 1], "thd", multiple=4)
    # Context parallel 2: rank 1 holds chunks 1 and 2 of each sequence (zig-zag), then SP 2 takes its half.
    assert local_positions(one_row, cp=(2, 1)).tolist() == [2, 3, 4, 5, 9, 10]
    assert local_positions(one_row, cp=(2, 1), sp=(2, 1)).tolist() == [5, 9, 10]
    assert local_positions(one_row, sp=(3, 2)).tolist() == [8, 9, 10, 11]


def test_filler_and_recorded_routing_back_into_sequences() -> None:
    assert filler(3, 2, 4).tolist() == [[0, 1], [2, 3], [0, 1]]
    mb = pack([torch.arange(4), torch.arange(3)], [0, 1], "packed")
    recorded = torch.arange(7 * TOPK).reshape(7, 1, TOPK)  # [T, rows, topk] as a router records
    rows = recorded.reshape(-1, 1, TOPK).transpose(0, 1)
    first, second = mb.per_sequence(rows)
    assert first.tolist() == recorded[:3, 0].tolist() and second.tolist() == recorded[4:6, 0].tolist()
    parts = [{0: {0: first.int()}}, {0: {2: first.int()}, 1: {0: second.int(), 2: second.int()}}]
    merged = assemble(parts, 2, LAYERS, TOPK)
    assert merged[0].shape == (3, LAYERS, TOPK) and torch.equal(merged[0][:, 2], first.int())
    assert not merged[0][:, 1].any()  # a layer nobody recorded (a dense one) stays 0
    with pytest.raises(RuntimeError, match="sequence 2"):
        assemble(parts, 3, LAYERS, TOPK)


def test_align_refuses_routing_of_the_wrong_shape() -> None:
    mb = pack([torch.arange(5)], [0], "packed")
    with pytest.raises(ValueError, match=r"expected \[4, 3, 2\]"):
        align(mb, [torch.zeros(5, LAYERS, TOPK, dtype=torch.long)], LAYERS, TOPK, EXPERTS)
    with pytest.raises(ValueError, match="outside 0..7"):
        align(mb, [torch.full((4, LAYERS, TOPK), EXPERTS)], LAYERS, TOPK, EXPERTS)


def test_flags_need_an_moe_model_and_turn_on_sglangs_capture(
    base: list[str], tiny_qwen3_moe: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from slime_like.arguments import parse_args

    with pytest.raises(SystemExit):
        parse_args([*base, "--use-rollout-routing-replay"])  # tiny_qwen3 is dense
    assert "a dense model" in capsys.readouterr().err
    moe = [*base[:1], str(tiny_qwen3_moe), *base[2:]]
    args = parse_args([*moe, "--use-rollout-routing-replay"])
    assert args.use_routing_replay and args.sglang_server_args.count("--enable-return-routed-experts") == 1
    assert (args.num_layers, args.moe_router_topk) == (2, 2)  # the layout of SGLang's routed experts
    args = parse_args([*moe, "--use-routing-replay"])
    assert not args.use_rollout_routing_replay and "--enable-return-routed-experts" not in args.sglang_server_args
