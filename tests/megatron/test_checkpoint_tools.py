"""tools/convert_hf_to_torch_dist.py and tools/convert_torch_dist_to_hf.py: bit-exact round trips across parallel
layouts for every family, refusals that name the field, and the engine loading a converted checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.megatron.launch import REPO_ROOT, torchrun
from tests.megatron.test_families import safetensors_of
from tests.megatron.tiny_families import (
    make_deepseek_v3,
    make_glm4,
    make_glm4_moe,
    make_llama3,
    make_mimo,
    make_minimax_m2,
    make_qwen3_5,
    make_qwen3_next,
)
from tools import convert_hf_to_torch_dist, convert_torch_dist_to_hf

WORKER = Path(__file__).with_name("convert_worker.py")
MOE = ("--expert-model-parallel-size", "2", "--expert-tensor-parallel-size", "1")


def _assert_same_weights(got_dir: Path, want_dir: Path) -> None:
    got, want = safetensors_of(got_dir), safetensors_of(want_dir)
    assert sorted(got) == sorted(want), set(got) ^ set(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


def test_round_trips_across_layouts_are_bit_exact(tiny_qwen3, tiny_qwen2_untied, tiny_qwen3_moe, tmp_path):
    """Every family: HF -> TP2 (+EP2 for experts) -> PP2 -> HF, and HF -> PP2 -> TP2 (expert TP2) -> HF."""
    families = {
        "qwen3": (tiny_qwen3, ()),
        "qwen2": (tiny_qwen2_untied, ()),
        "llama3": (make_llama3(tmp_path / "llama3", tiny_qwen3), ()),
        "qwen3_moe": (tiny_qwen3_moe, MOE),
        "deepseek_v3": (make_deepseek_v3(tmp_path / "deepseek_v3", tiny_qwen3), MOE),
        # Its multi-token-prediction layer is copied from the original; GLM-4's fc1 is one HF tensor.
        "glm4_moe": (make_glm4_moe(tmp_path / "glm4_moe", tiny_qwen3), MOE),
        "glm4": (make_glm4(tmp_path / "glm4", tiny_qwen3), ()),
        # Its MTP layer (model.mtp_layers.0) is copied from the original too; custom config code travels along.
        "mimo": (make_mimo(tmp_path / "mimo", tiny_qwen3), ()),
        # Its all-heads q/k norms are whole on every TP rank; block_sparse_moe experts split over EP.
        "minimax_m2": (make_minimax_m2(tmp_path / "minimax_m2", tiny_qwen3), MOE),
        # Gated delta net: in_proj and conv1d split per part over TP; Qwen3.5's vision tower is copied through.
        "qwen3_next": (make_qwen3_next(tmp_path / "qwen3_next", tiny_qwen3), MOE),
        "qwen3_5_moe": (make_qwen3_5(tmp_path / "qwen3_5_moe", tiny_qwen3, moe=True), MOE),
    }
    steps = []
    for name, (hf, moe) in families.items():
        out = tmp_path / name
        tp2, pp2 = ["--tensor-model-parallel-size", "2"], ["--pipeline-model-parallel-size", "2"]
        steps += [
            ["hf_to_torch_dist", ["--hf-checkpoint", str(hf), "--save", str(out / "td_tp2"), *tp2, *moe]],
            ["torch_dist_to_hf", ["--load", str(out / "td_tp2"), "--hf-checkpoint", str(hf), "--save", str(out / "a"), *pp2]],
            ["hf_to_torch_dist", ["--hf-checkpoint", str(hf), "--save", str(out / "td_pp2"), *pp2]],
            ["torch_dist_to_hf", ["--load", str(out / "td_pp2"), "--hf-checkpoint", str(hf), "--save", str(out / "b"), *tp2]],
        ]  # fmt: skip
    (tmp_path / "steps.json").write_text(json.dumps(steps))
    torchrun(WORKER, [str(tmp_path / "steps.json")], timeout=600)
    for name, (hf, _) in families.items():
        for result in ("a", "b"):
            _assert_same_weights(tmp_path / name / result, hf)
        # Config, tokenizer and chat template come from the original directory.
        for extra in ("config.json", "tokenizer.json", "chat_template.jinja"):
            assert (tmp_path / name / "a" / extra).read_bytes() == (hf / extra).read_bytes(), (name, extra)
    # MiMo's configuration code travels with its config.json: the converted checkpoint loads as the original does.
    assert (tmp_path / "mimo" / "a" / "configuration_mimo.py").read_bytes() == (
        families["mimo"][0] / "configuration_mimo.py"
    ).read_bytes()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--hidden-size", "128"], "--hidden-size 128 contradicts hidden_size=64"),
        (["--num-layers", "3"], "--num-layers 3 contradicts num_hidden_layers=2"),
        (["--num-attention-heads", "8"], "--num-attention-heads 8 contradicts num_attention_heads=4"),
        (["--vocab-size", "1000"], "--vocab-size 1000 contradicts vocab_size=512"),
        (["--num-query-groups", "4"], "--num-query-groups 4 contradicts num_key_value_heads=2"),
        (["--tensor-model-parallel-size", "3"], "num_attention_heads=4 in the HF config is not divisible by"),
        (["--untie-embeddings-and-output-weights"], "--untie-embeddings-and-output-weights is set"),
    ],
)
def test_conversion_refuses_mismatched_arguments(flags, message, tiny_qwen3, tmp_path, capsys) -> None:
    for tool, io in [
        (convert_hf_to_torch_dist, ["--save", str(tmp_path / "td")]),
        (convert_torch_dist_to_hf, ["--load", str(tmp_path / "td"), "--save", str(tmp_path / "hf")]),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            tool.main(["--hf-checkpoint", str(tiny_qwen3), *io, *flags])
        assert message in str(exit_info.value), exit_info.value
    assert not (tmp_path / "td").exists() and not (tmp_path / "hf").exists()


def test_checkpoint_of_another_config_is_refused_by_tensor(tiny_qwen3, megatron_world, tmp_path) -> None:
    convert_hf_to_torch_dist.main(["--hf-checkpoint", str(tiny_qwen3), "--save", str(tmp_path / "td")])
    other = tmp_path / "wider"
    shutil.copytree(tiny_qwen3, other)
    config = json.loads((other / "config.json").read_text())
    config["intermediate_size"] = 96
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(SystemExit) as exit_info:
        convert_torch_dist_to_hf.main(
            ["--load", str(tmp_path / "td"), "--hf-checkpoint", str(other), "--save", str(tmp_path / "hf")]
        )
    # torch_dist stacks the layers: one tensor for all of them.
    message = "decoder.layers.mlp.linear_fc2.weight: the checkpoint has shape (2, 64, 128), the model built from the HF"
    assert message in str(exit_info.value)


def test_engine_loads_a_converted_checkpoint(tiny_qwen3, megatron_world, tmp_path) -> None:
    """The converter writes Megatron-LM's release layout; an engine built from tiny_qwen3 takes other weights from it
    (logits equal to an engine built from those HF weights) and trains on."""
    from slime_like.trainer.megatron.checkpoint_conversion import copy_model_files, write_safetensors
    from slime_like.trainer.megatron.checkpoint_layout import find_checkpoint
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.optimizer import OptimizerSettings
    from tests.megatron.common import fixed_batch, num_targets, token_ce_loss

    seqs = fixed_batch()
    loss_fn = token_ce_loss(num_targets(seqs))
    settings = OptimizerSettings(lr=1e-2)
    trained = MegatronTrainEngine(tiny_qwen3, settings, max_tokens_per_micro_batch=40)
    trained.train_step(seqs, [None] * len(seqs), loss_fn)
    other = tmp_path / "other"
    write_safetensors(trained.export_hf_weights(), other)
    copy_model_files(tiny_qwen3, other)
    convert_hf_to_torch_dist.main(["--hf-checkpoint", str(other), "--save", str(tmp_path / "td")])

    # As slime's converter: <save>/release/ and a tracker holding "release" (no newline), nothing left aside.
    assert (tmp_path / "td" / "latest_checkpointed_iteration.txt").read_text() == "release"
    assert sorted(p.name for p in (tmp_path / "td").iterdir()) == ["latest_checkpointed_iteration.txt", "release"]
    checkpoint = find_checkpoint(tmp_path / "td")
    assert checkpoint.directory == tmp_path / "td" / "release" and checkpoint.release

    engine = MegatronTrainEngine(tiny_qwen3, settings, max_tokens_per_micro_batch=40)
    assert not torch.equal(engine.forward_logprobs(seqs)[0], trained.forward_logprobs(seqs)[0])
    engine.load_checkpoint(checkpoint.directory)
    fresh = MegatronTrainEngine(other, settings, max_tokens_per_micro_batch=40)
    for got, want in zip(engine.forward_logprobs(seqs), fresh.forward_logprobs(seqs), strict=True):
        assert torch.equal(got, want)
    # The optimizer follows the loaded weights: the next step is the one of an engine built from them.
    assert engine.train_step(seqs, [None] * len(seqs), loss_fn) == fresh.train_step(seqs, [None] * len(seqs), loss_fn)
    # Back to HF from a plain torch_dist directory (as the engine writes one: optimizer and RNG too, skipped).
    trained.save_checkpoint(tmp_path / "plain")
    back = ["--hf-checkpoint", str(tiny_qwen3), "--save", str(tmp_path / "back")]
    convert_torch_dist_to_hf.main(["--load", str(tmp_path / "plain"), *back])
    _assert_same_weights(tmp_path / "back", other)
    with pytest.raises(SystemExit, match="no torch_dist checkpoint there"):
        convert_torch_dist_to_hf.main(["--load", str(tmp_path), *back])


def test_tools_help_is_instant() -> None:
    import subprocess
    import sys
    import time

    for tool in ("convert_hf_to_torch_dist.py", "convert_torch_dist_to_hf.py"):
        start = time.monotonic()
        out = subprocess.run(
            [sys.executable, str(REPO_ROOT / "tools" / tool), "--help"], capture_output=True, text=True
        )
        assert out.returncode == 0 and "--tensor-model-parallel-size" in out.stdout, out.stderr
        assert time.monotonic() - start < 10  # no torch/megatron import before parsing
