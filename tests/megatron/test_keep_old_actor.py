"""slime's --keep-old-actor on a real trainer rank: the old policy's log-probs come from the weights kept for it
(slime's old_actor), rotated at each weight update as slime rotates them, never from the current weights."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.megatron.algo_common import actor_args, make_data


def hf_log_probs(hf_dir: Path, tokens: list[list[int]], lengths: list[int]) -> list[torch.Tensor]:
    """The response tokens' log-probs under the HF checkpoint, by transformers (the hand check of the start weights)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for seq, n in zip(tokens, lengths, strict=True):
            ids = torch.tensor([seq])
            out.append(torch.log_softmax(model(ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[-n:, 0])
    return out


def worst(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def test_old_log_probs_come_from_the_kept_weights(
    tiny_qwen3: Path, megatron_world: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from slime_like.trainer.actor import TrainActor

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, os.environ.get(key, "0"))  # TrainActor sets them; restored after the test
    actor = TrainActor(actor_args(tiny_qwen3, ["--keep-old-actor", "--update-weight-transport", "disk"]), 0, "", 0)
    data = make_data()
    share = actor._own_share(data)
    tokens, lengths = share.data.tokens, share.data.response_lengths

    def old() -> list[torch.Tensor]:
        before = actor._snapshot()
        forwards, _ = actor._forwards(share)
        assert all(torch.equal(v, before[k]) for k, v in actor._snapshot().items())  # the current weights are back
        return forwards.old_log_probs

    def current() -> list[torch.Tensor]:
        return [lp[-n:] for lp, n in zip(actor.engine.forward_logprobs(tokens, local=True), lengths, strict=True)]

    start = hf_log_probs(tiny_qwen3, tokens, lengths)  # W0, the --hf-checkpoint the engines start with
    assert worst(old(), start) < 1e-4

    def update(version: int) -> None:  # a real weight update (disk transport, no server listening)
        actor.update_weights([], version, "disk", str(tmp_path))

    actor.train(0, data)  # the weights are now W1
    after_one = current()
    assert worst(after_one, start) > 1e-3  # training moved the policy: the check below can tell them apart
    update(1)  # slime's queue: old_actor <- rollout_actor (W0), rollout_actor <- W1
    assert worst(old(), start) < 1e-4  # rollout 1 came from W0 in the one-step-ahead loop
    assert worst(old(), after_one) > 1e-3

    actor.train(1, data)  # W2
    assert worst(current(), after_one) > 1e-3
    update(2)  # old_actor <- W1, rollout_actor <- W2
    assert worst(old(), after_one) < 1e-6
    assert worst(old(), current()) > 1e-3
