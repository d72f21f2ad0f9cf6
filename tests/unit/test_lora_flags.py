"""LoRA flags: target names (Megatron, HF, all-linear), errors naming the fix, the SGLang server flags they add,
and rollout requests that name the adapter."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout.generate import with_adapter
from rollout.sglang_server import SGLangServer
from slime_like.arguments import parse_args
from slime_like.trainer.megatron.lora_flags import resolve_targets


def test_targets_take_megatron_hf_and_all_linear_names() -> None:
    assert resolve_targets("all-linear") == ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
    assert resolve_targets("q_proj,k_proj,v_proj,o_proj") == ("linear_qkv", "linear_proj")
    assert resolve_targets("linear_fc2, gate_proj,up_proj") == ("linear_fc2", "linear_fc1")
    with pytest.raises(ValueError, match="fuses q_proj, k_proj, v_proj into linear_qkv.*name all of"):
        resolve_targets("q_proj,v_proj")
    with pytest.raises(ValueError, match="unknown module 'lm_head'"):
        resolve_targets("lm_head")


def test_lora_flags_add_sglang_lora_serving(base: list[str]) -> None:
    args = parse_args(base + ["--lora-rank", "8", "--lora-alpha", "16", "--target-modules", "linear_qkv,o_proj"])
    assert args.lora_targets == ("linear_qkv", "linear_proj")
    assert args.sglang_server_args == [
        "--enable-lora", "--max-lora-rank", "8", "--lora-target-modules", "q_proj", "k_proj", "v_proj", "o_proj",
        "--max-loras-per-batch", "1",
    ]  # fmt: skip
    plain = parse_args(base)
    assert plain.lora_rank == 0 and "--enable-lora" not in plain.sglang_server_args


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--lora-rank", "4"], "--lora-rank needs --target-modules"),
        (["--target-modules", "all-linear"], "--target-modules set up LoRA, which needs a positive --lora-rank"),
        (["--lora-rank", "4", "--target-modules", "gate_proj"], "name all of gate_proj,up_proj"),
        (["--lora-rank", "4", "--target-modules", "all-linear", "--lora-dropout", "1"], "--lora-dropout 1.0"),
        (
            ["--lora-rank", "4", "--target-modules", "all-linear", "--lora-adapter-path", "/nonexistent"],
            "--lora-adapter-path /nonexistent: no adapter_config.json there",
        ),
        (
            [
                "--lora-rank",
                "4",
                "--target-modules",
                "all-linear",
                "--pipeline-model-parallel-size",
                "2",
                "--actor-num-gpus-per-node",
                "2",
            ],
            "--lora-rank does not support --pipeline-model-parallel-size > 1",
        ),  # fmt: skip
        (
            ["--lora-rank", "4", "--target-modules", "all-linear", "--multi-lora-n-adapters", "2"],
            "--multi-lora-n-adapters 2 needs adapters: add --multi-lora-adapter NAME CONFIG",
        ),
        (["--multi-lora-adapter", "gsm8k", "gsm8k.yaml"], "--multi-lora-adapter needs --lora-rank"),
    ],
)
def test_lora_contradictions_name_the_flags(
    base: list[str], capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    with pytest.raises(SystemExit):
        parse_args(base + extra)
    assert message in capsys.readouterr().err


def test_requests_name_the_adapter_in_a_lora_run_only(tiny_qwen3: Path) -> None:
    class Args:
        lora_rank = 4

    payload = {"input_ids": [1, 2]}
    assert with_adapter(Args, payload) == {"input_ids": [1, 2], "lora_path": "policy"}
    assert with_adapter(Args, {**payload, "lora_path": "mine"})["lora_path"] == "mine"
    assert with_adapter(object(), payload) is payload
    cmd, _ = SGLangServer(tiny_qwen3, port=30000, device="cpu", extra_args=["--enable-lora"]).command()
    # CPU: SGLang's LoRA manager needs the unpinning hooks (rollout.sglang_launch) and the torch_native backend.
    assert "rollout.sglang_launch" in cmd and cmd[cmd.index("--lora-backend") + 1] == "torch_native"
    # GPU: SGLang's default backend, through rollout.sglang_launch too (its one-request adapter swap).
    gpu, _ = SGLangServer(tiny_qwen3, port=30000, device="cuda", extra_args=["--enable-lora"]).command()
    assert "rollout.sglang_launch" in gpu and "--lora-backend" not in gpu
