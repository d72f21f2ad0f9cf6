"""LoRA on the Megatron model: a new adapter leaves the base's log-probs, a step moves the adapters only, the PEFT
export gives the same log-probs in peft + transformers and loads back; TP=2 reproduces one process, and its
torch_dist checkpoint loads at TP=1."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.megatron.common import fixed_batch, forward_on_device, num_targets, token_ce_loss
from tests.megatron.launch import torchrun

RANK, ALPHA = 4, 8.0
WORKER = Path(__file__).with_name("lora_worker.py")


def lora_run(hf_dir: Path, adapter_dir: Path) -> dict:
    """After init_parallel: base log-probs, a LoRA engine's log-probs before and after two steps, its parameters
    before and after, and its PEFT export in adapter_dir (shared with the TP=2 worker)."""
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.lora import LoraSettings
    from slime_like.trainer.megatron.optimizer import OptimizerSettings

    seqs = fixed_batch()
    base = MegatronTrainEngine(hf_dir, None).forward_logprobs(seqs)
    settings = OptimizerSettings(lr=1e-2)
    engine = MegatronTrainEngine(hf_dir, settings, lora=LoraSettings(RANK, ALPHA, targets=_ALL))
    before = {n: p.detach().clone() for n, p in engine.model[0].named_parameters()}
    start = engine.forward_logprobs(seqs)
    metrics = [engine.train_step(seqs, [None] * len(seqs), token_ce_loss(num_targets(seqs))) for _ in range(2)]
    after = {n: p.detach().clone() for n, p in engine.model[0].named_parameters()}
    trained = engine.forward_logprobs(seqs)
    engine.save_adapter(adapter_dir)
    return {
        "base": base,
        "start": start,
        "trained": trained,
        "metrics": metrics,
        "before": before,
        "after": after,
        "engine": engine,
    }


_ALL = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


@pytest.fixture(scope="module")
def run(tiny_qwen3, megatron_world, tmp_path_factory) -> dict:
    return lora_run(tiny_qwen3, tmp_path_factory.mktemp("adapter"))


def _worst(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def test_new_adapter_leaves_base_logprobs_and_a_step_moves_adapters_only(run) -> None:
    assert _worst(run["start"], run["base"]) == 0.0  # B = 0
    assert _worst(run["trained"], run["base"]) > 1e-3  # the adapters changed the policy
    adapters = [n for n in run["before"] if ".lora." in n]
    assert len(adapters) == 2 * 4 * 2  # A and B of 4 layers in each of 2 decoder layers
    for name, tensor in run["before"].items():
        moved = not torch.equal(tensor, run["after"][name])
        assert moved == (name in adapters), name  # base bit-identical; after 2 steps every A and B moved
    engine = run["engine"]
    trainable = {n for m in engine.model for n, p in m.named_parameters() if p.requires_grad}
    assert trainable == {n for n in run["before"] if ".lora." in n}
    # Megatron's optimizer holds the adapters only.
    held = sum(p.numel() for g in engine.optimizer.param_groups for p in g["params"])
    assert held == sum(run["before"][n].numel() for n in adapters)


def test_peft_export_gives_the_same_logprobs_and_loads_back(run, tiny_qwen3, tmp_path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    engine = run["engine"]
    directory = engine.save_adapter(tmp_path / "adapter")
    hf = AutoModelForCausalLM.from_pretrained(tiny_qwen3, dtype=torch.float32)
    model = PeftModel.from_pretrained(hf, str(directory)).eval()
    from slime_like.trainer.megatron.cpu_compat import cuda_to_cpu

    tokens = torch.randint(0, 512, (2, 23), generator=torch.Generator().manual_seed(1))
    mask = ~torch.ones(23, 23, dtype=torch.bool).tril()[None, None].expand(2, 1, 23, 23)
    positions = torch.arange(23)[None].expand(2, 23)
    with torch.no_grad(), cuda_to_cpu():
        logits = forward_on_device(engine.model[0].eval(), tokens, positions, mask)
        torch.testing.assert_close(model(tokens).logits, logits, atol=1e-5, rtol=0)
        for seq, expected in zip(fixed_batch(), run["trained"], strict=True):
            logprobs = model(seq[None]).logits[0].log_softmax(-1)[:-1].gather(1, seq[1:, None])[:, 0]
            torch.testing.assert_close(logprobs, expected, atol=1e-5, rtol=0)
    # The adapter loads back into a fresh LoRA engine exactly.
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.lora import LoraSettings

    fresh = MegatronTrainEngine(tiny_qwen3, None, lora=LoraSettings(RANK, ALPHA, targets=_ALL, seed=7))
    fresh.load_adapter(directory)
    assert _worst(fresh.forward_logprobs(fixed_batch()), run["trained"]) == 0.0
    wrong = MegatronTrainEngine(tiny_qwen3, None, lora=LoraSettings(2 * RANK, ALPHA, targets=_ALL))
    with pytest.raises(ValueError, match="does not match --lora-rank 8"):
        wrong.load_adapter(directory)


def test_moe_experts_are_refused_with_the_fix(tiny_qwen3_moe, megatron_world) -> None:
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.lora import LoraSettings

    with pytest.raises(ValueError, match="mixture-of-experts layer.*linear_qkv,linear_proj"):
        MegatronTrainEngine(tiny_qwen3_moe, None, lora=LoraSettings(RANK, ALPHA, targets=_ALL))


def test_tp2_matches_one_process(run, tiny_qwen3, tmp_path) -> None:
    checkpoint = tmp_path / "checkpoint"
    torchrun(WORKER, [str(tiny_qwen3), str(tmp_path / "tp2.pt"), str(tmp_path / "adapter"), str(checkpoint)])
    got = torch.load(tmp_path / "tp2.pt", weights_only=False)
    assert _worst(got["start"], run["base"]) < 1e-5
    assert _worst(got["trained"], run["trained"]) < 1e-5
    for g, r in zip(got["metrics"], run["metrics"], strict=True):
        assert g["loss"] == pytest.approx(r["loss"], abs=1e-5)
        assert g["grad_norm"] == pytest.approx(r["grad_norm"], abs=1e-5)
    # The TP=2 export (gathered from both ranks) is the same adapter.
    from safetensors.torch import load_file

    mine = load_file(str(run["engine"].save_adapter(tmp_path / "tp1") / "adapter_model.safetensors"))
    theirs = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    assert sorted(mine) == sorted(theirs)
    for key, tensor in mine.items():
        torch.testing.assert_close(theirs[key], tensor, atol=1e-5, rtol=0, msg=key)
    # The TP=2 torch_dist checkpoint (split adapters, fc1's B in gate and up halves) loads at TP=1.
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.lora import LoraSettings

    resumed = MegatronTrainEngine(tiny_qwen3, None, lora=LoraSettings(RANK, ALPHA, targets=_ALL, seed=7))
    resumed.load_model_weights(checkpoint)
    assert _worst(resumed.forward_logprobs(fixed_batch()), got["trained"]) < 1e-5


def test_lora_checkpoint_converts_to_hf_with_the_adapter_merged(run, tiny_qwen3, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    from tools import convert_torch_dist_to_hf

    run["engine"].save_checkpoint(tmp_path / "checkpoint", iteration=2)
    io = ["--load", str(tmp_path / "checkpoint"), "--hf-checkpoint", str(tiny_qwen3), "--save", str(tmp_path / "hf")]
    with pytest.raises(SystemExit, match=r"LoRA adapters \(rank 4 on linear_qkv,linear_proj,linear_fc1,linear_fc2\)"):
        convert_torch_dist_to_hf.main(io)  # the checkpoint does not record alpha: the error names --lora-alpha
    convert_torch_dist_to_hf.main([*io, "--lora-alpha", str(ALPHA)])
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    with torch.no_grad():
        for seq, expected in zip(fixed_batch(), run["trained"], strict=True):
            logprobs = merged(seq[None]).logits[0].log_softmax(-1)[:-1].gather(1, seq[1:, None])[:, 0]
            torch.testing.assert_close(logprobs, expected, atol=1e-5, rtol=0)
    # The adapter alone comes out too, equal to the engine's own PEFT export.
    from safetensors.torch import load_file

    mine = load_file(str(run["engine"].save_adapter(tmp_path / "adapter") / "adapter_model.safetensors"))
    written = load_file(str(tmp_path / "hf" / "lora_adapter" / "adapter_model.safetensors"))
    assert sorted(written) == sorted(mine)
    for key, tensor in mine.items():
        torch.testing.assert_close(written[key], tensor, atol=0, rtol=0, msg=key)
