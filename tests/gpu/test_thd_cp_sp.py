"""GPU fast paths of the training engine: THD packed sequences, context parallel (zig-zag), sequence parallel.

Each compares a layout with a reference on the same weights, in bf16: THD with the padded fallback and
with transformers; CP=2 and TP=2+SP (two GPUs, since NCCL refuses two ranks on one device) with DP=2
and TP=2. The tiny model's weights are sharpened so that log-probs spread over several nats: a
misplaced target or position then shows far above bf16 noise.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from slime_like.trainer.megatron.cpu_compat import transformer_engine_available
from tests.megatron.common import fixed_batch
from tests.megatron.launch import torchrun

WORKER = Path(__file__).with_name("parallel_worker.py")

pytestmark = [
    pytest.mark.skipif(not transformer_engine_available(), reason="needs CUDA with Transformer Engine"),
]
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (NCCL refuses two ranks on one GPU)")


@pytest.fixture(scope="module")
def sharp_model(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3 with its matrices scaled by 8 (log-probs spread ~1.3 nats instead of ~0.14)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_qwen3, dtype=torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.mul_(8.0)
    out = tmp_path_factory.mktemp("sharp-qwen3")
    model.save_pretrained(out)
    return out


def _close(got: list[torch.Tensor], ref: list[torch.Tensor], mean: float, worst: float, what: str) -> None:
    """bf16 tolerances: mean and largest absolute difference over all positions."""
    diff = torch.cat([(g - r).abs() for g, r in zip(got, ref, strict=True)])
    assert diff.mean() < mean and diff.max() < worst, f"{what}: mean {diff.mean():.4f}, max {diff.max():.4f}"


def _same_training(got: dict, ref: dict, what: str) -> None:
    for step, (g, r) in enumerate(zip(got["metrics"], ref["metrics"], strict=True)):
        assert g["loss"] == pytest.approx(r["loss"], rel=1e-2), (what, step, "loss")
        assert g["grad_norm"] == pytest.approx(r["grad_norm"], rel=5e-2), (what, step, "grad_norm")
        assert g["tokens"] == r["tokens"], (what, step, "tokens")
    _close(got["before"], ref["before"], 0.02, 0.25, f"{what} log-probs")
    _close(got["entropy"], ref["entropy"], 0.02, 0.25, f"{what} entropy")
    _close(got["after"], ref["after"], 0.03, 0.3, f"{what} log-probs after 3 steps")


def test_thd_matches_padded_and_transformers(sharp_model, tmp_path):
    import transformers

    torchrun(WORKER, [str(tmp_path / "out.pt"), str(sharp_model), "thd", "padded"], nproc=1)
    results = torch.load(tmp_path / "out.pt", weights_only=False)
    assert results["thd"]["layout"] == "thd" and results["padded"]["layout"] == "padded"
    _same_training(results["thd"], results["padded"], "thd vs padded")
    hf = transformers.AutoModelForCausalLM.from_pretrained(sharp_model, dtype=torch.float32)
    with torch.no_grad():
        ref = [torch.log_softmax(hf(s[None]).logits[0, :-1], -1).gather(-1, s[1:, None])[:, 0] for s in fixed_batch()]
    assert torch.cat(ref).std() > 0.5  # the sharpened model really spreads its log-probs
    _close(results["thd"]["before"], ref, 0.05, 0.4, "thd vs transformers (fp32)")


@two_gpus
def test_context_parallel_2_matches_data_parallel(sharp_model, tmp_path):
    torchrun(WORKER, [str(tmp_path / "out.pt"), str(sharp_model), "dp2", "cp2"])
    results = torch.load(tmp_path / "out.pt", weights_only=False)
    assert results["cp2"]["layout"] == "thd" and results["cp2"]["pad_multiple"] == 4
    _same_training(results["cp2"], results["dp2"], "cp2 vs dp2")


@two_gpus
def test_sequence_parallel_matches_tensor_parallel(sharp_model, tmp_path):
    torchrun(WORKER, [str(tmp_path / "out.pt"), str(sharp_model), "tp2", "tp2sp"])
    results = torch.load(tmp_path / "out.pt", weights_only=False)
    assert results["tp2sp"]["pad_multiple"] == 2 and results["tp2"]["pad_multiple"] == 1
    _same_training(results["tp2sp"], results["tp2"], "tp2 + sequence parallel vs tp2")
