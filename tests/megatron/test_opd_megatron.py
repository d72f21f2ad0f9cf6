"""--use-opd --opd-type megatron: the teacher's log-probs come from its Megatron checkpoint, forwarded in the trainer;
the reverse KL the step reports equals one computed with transformers on both HF models."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.megatron.algo_common import actor_args, make_data
from tools import convert_hf_to_torch_dist


@pytest.fixture
def make_actor(tiny_qwen3: Path, megatron_world: None, monkeypatch: pytest.MonkeyPatch):
    from slime_like.trainer.actor import TrainActor

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, os.environ.get(key, "0"))  # TrainActor sets them; restored after the test
    return lambda *flags: TrainActor(actor_args(tiny_qwen3, list(flags)), 0, "127.0.0.1", 0)


def hf_log_probs(hf_dir: Path, tokens: list[list[int]]) -> list[torch.Tensor]:
    """log p(token_t | tokens_<t) for t >= 1 by transformers, per sequence."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for seq in tokens:
            ids = torch.tensor([seq])
            out.append(torch.log_softmax(model(ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0])
    return out


def test_teacher_from_its_checkpoint_gives_the_reverse_kl(make_actor, tiny_qwen3: Path, tmp_path: Path) -> None:
    from slime_like.trainer.megatron.checkpoint_conversion import copy_model_files, write_safetensors

    donor = make_actor()
    donor.train(0, make_data())  # other weights of the same architecture: the teacher
    write_safetensors(donor.engine.export_hf_weights(), tmp_path / "teacher-hf")
    copy_model_files(tiny_qwen3, tmp_path / "teacher-hf")
    convert_hf_to_torch_dist.main(["--hf-checkpoint", str(tmp_path / "teacher-hf"), "--save", str(tmp_path / "t")])

    flags = ("--use-opd", "--opd-type", "megatron", "--opd-teacher-load", str(tmp_path / "t"), "--opd-kl-coef", "0.5")
    actor = make_actor(*flags)
    fresh = make_actor()._snapshot()
    assert all(torch.equal(v, fresh[k]) for k, v in actor._snapshot().items())  # the policy is not the teacher
    data = make_data()
    metrics = actor.train(0, data)

    student, teacher = hf_log_probs(tiny_qwen3, data.tokens), hf_log_probs(tmp_path / "teacher-hf", data.tokens)
    diffs = [
        ((s[-n:] - t[-n:]) * torch.tensor(m, dtype=torch.float32)).sum()
        for s, t, n, m in zip(student, teacher, data.response_lengths, data.loss_masks, strict=True)
    ]
    expected = float(sum(diffs)) / sum(map(sum, data.loss_masks))  # slime's opd_reverse_kl: mean over loss tokens
    assert abs(expected) > 1e-3  # the teacher differs from the student
    assert metrics["train/opd_reverse_kl"] == pytest.approx(expected, abs=1e-5)
