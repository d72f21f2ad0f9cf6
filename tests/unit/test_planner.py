"""The planner: parameter counts and memory arithmetic against independent counts; every layout check through the real
argument parser (a real start refuses what cannot be placed; a memory estimate only warns; --dry-run refuses both)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import transformers

from slime_like.arguments import parse_args
from slime_like.core.hf_config import load_hf_config, text_config
from slime_like.planner import GIB, _layers_per_stage, layout_problems, make_plan, model_size, training_memory
from tools.reference_configs import REFERENCE_CONFIGS, published_config, write_reference_config


def real_count(config: transformers.PretrainedConfig) -> int:
    """The number of parameters transformers actually builds for this config."""
    model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def test_counts_match_the_tiny_dense_and_moe_models(
    tiny_qwen3: Path, tiny_qwen3_moe: Path, tiny_qwen2_untied: Path
) -> None:
    for path in (tiny_qwen3, tiny_qwen3_moe):
        config = transformers.AutoConfig.from_pretrained(path)
        assert model_size(config).total == real_count(config)


def test_count_matches_a_small_mla_moe_model() -> None:
    config = transformers.DeepseekV3Config(
        hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32,
        first_k_dense_replace=1, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
        v_head_dim=8, vocab_size=100, tie_word_embeddings=False, n_group=1, topk_group=1,
    )  # fmt: skip
    size = model_size(config)
    assert size.total == real_count(config)
    assert size.expert_params == 2 * 4 * 3 * 64 * 32  # 2 MoE layers x 4 experts x (gate, up, down)


def test_published_sizes() -> None:
    config = transformers.Qwen3Config(
        hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, vocab_size=151936, tie_word_embeddings=True,
    )  # fmt: skip
    assert model_size(config).total / 1e9 == pytest.approx(4.02, abs=0.01)  # Qwen3-4B: 4.0B


def args(**kw: object) -> SimpleNamespace:
    base = dict(
        world_size=8, tensor_model_parallel_size=2, pipeline_model_parallel_size=1, context_parallel_size=1,
        expert_model_parallel_size=1, expert_tensor_parallel_size=None, bf16=True, use_distributed_optimizer=True,
        max_tokens_per_gpu=1000, decoder_first_pipeline_num_layers=None, decoder_last_pipeline_num_layers=None,
    )  # fmt: skip
    return SimpleNamespace(**{**base, **kw})


def test_training_memory_hand_computed() -> None:
    # 1e9 dense params, TP 2 -> 5e8 per GPU: bf16 weights 1e9 B, fp32 grads 2e9 B,
    # Adam 12 B/param over DP 4 -> 1.5e9 B; activations 34 * 1000 tokens * 1000 hidden * 10 layers / TP 2 = 1.7e8 B.
    size = SimpleNamespace(dense_params=10**9, expert_params=0, hidden=1000, layers=10)
    mem = training_memory(args(), size)
    assert mem == pytest.approx({"weights": 1e9, "grads": 2e9, "optimizer": 1.5e9, "activations": 1.7e8})
    assert sum(mem.values()) / GIB == pytest.approx(4.67e9 / GIB)


def test_uneven_pipeline_stages() -> None:
    assert _layers_per_stage(args(pipeline_model_parallel_size=8), 61) is None
    assert _layers_per_stage(args(pipeline_model_parallel_size=8, decoder_first_pipeline_num_layers=7,
                                  decoder_last_pipeline_num_layers=6), 61) == 8  # fmt: skip
    assert _layers_per_stage(args(pipeline_model_parallel_size=4), 48) == 12


# Every start runs the planner's layout checks through the real parser: each error names the flags and numbers.


@pytest.fixture(scope="module")
def heads24(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A config-only checkpoint with 24 attention heads and 12 KV heads (6 layers): TP 8 splits the heads, not
    the KV heads; TP 3 splits both."""
    out = tmp_path_factory.mktemp("heads24")
    transformers.Qwen3Config(
        hidden_size=384, intermediate_size=64, num_hidden_layers=6, num_attention_heads=24, num_key_value_heads=12,
        head_dim=16, vocab_size=128, tie_word_embeddings=True,
    ).save_pretrained(out)  # fmt: skip
    return out


@pytest.fixture(scope="module")
def heads24_kv8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 attention heads and 8 KV heads: TP 3 splits the heads but neither divides nor is divided by 8."""
    out = tmp_path_factory.mktemp("heads24_kv8")
    transformers.Qwen3Config(
        hidden_size=384, intermediate_size=64, num_hidden_layers=6, num_attention_heads=24, num_key_value_heads=8,
        head_dim=16, vocab_size=128, tie_word_embeddings=True,
    ).save_pretrained(out)  # fmt: skip
    return out


def with_checkpoint(base: list[str], path: Path) -> list[str]:
    """The required flags of `base`, with another --hf-checkpoint."""
    flags = list(base)
    flags[flags.index("--hf-checkpoint") + 1] = str(path)
    return flags


def refused(flags: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """parse_args fails as argparse does (exit 2) before anything starts; returns what it printed."""
    with pytest.raises(SystemExit) as exit_:
        parse_args(flags)
    assert exit_.value.code == 2
    return capsys.readouterr().err


# (checkpoint fixture, extra flags, the message) for each layout error of the planner.
LAYOUT_ERRORS = [
    ("tiny_qwen3", ["--rollout-num-gpus", "3", "--rollout-num-gpus-per-engine", "2"],
     "--rollout-num-gpus 3 is not a multiple of --rollout-num-gpus-per-engine 2: 1 engine(s) would leave 1 "
     "rollout GPU(s) unused"),
    ("heads24", ["--rollout-num-gpus", "12", "--rollout-num-gpus-per-engine", "12", "--num-gpus-per-node", "8"],
     "--rollout-num-gpus-per-engine 12 is wider than a node (--num-gpus-per-node 8) but not a multiple of it: an "
     "engine would span 1 whole node(s) and 4 GPU(s) of another (use a multiple of 8)"),
    ("heads24", ["--rollout-num-gpus", "3", "--rollout-num-gpus-per-engine", "3"],
     "--rollout-num-gpus-per-engine 3 does not divide --num-gpus-per-node 8: an engine would straddle two nodes "
     "(use a divisor of 8)"),
    ("tiny_qwen3", ["--rollout-num-gpus", "4", "--rollout-num-gpus-per-engine", "2", "--num-gpus-per-node", "4"],
     "the rollout GPUs follow the trainer's 1 (--actor-num-nodes 1 x --actor-num-gpus-per-node 1, not --colocate), "
     "so engine 1 of --rollout-num-gpus-per-engine 2 would take GPUs 3-4, across nodes 0 and 1 "
     "(--num-gpus-per-node 4): make the trainer's GPUs a multiple of 2, or use --colocate"),
    ("heads24", ["--rollout-num-gpus", "4", "--rollout-num-gpus-per-engine", "4", "--num-gpus-per-node", "2"],
     "the rollout GPUs follow the trainer's 1 (--actor-num-nodes 1 x --actor-num-gpus-per-node 1, not --colocate), "
     "so engine 0 of --rollout-num-gpus-per-engine 4 would take GPUs 1-4, starting at GPU 1 of node 0, not on a "
     "node's first GPU (--num-gpus-per-node 2): make the trainer's GPUs a multiple of 2, or use --colocate"),
    ("tiny_qwen3", ["--actor-num-gpus-per-node", "8", "--num-gpus-per-node", "4", "--rollout-num-gpus", "4"],
     "--actor-num-gpus-per-node 8 exceeds --num-gpus-per-node 4"),
    ("tiny_qwen3", ["--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "2", "--num-gpus-per-node", "2",
                    "--num-nodes", "1"],
     "the plan needs 2 nodes of --num-gpus-per-node 2 for 4 GPUs (the trainer's 2 + --rollout-num-gpus 2) but "
     "--num-nodes is 1"),
    ("tiny_qwen3", ["--actor-num-gpus-per-node", "3", "--tensor-model-parallel-size", "3"],
     "4 attention heads (num_attention_heads of the HF config) do not divide over --tensor-model-parallel-size 3"),
    ("heads24_kv8", ["--actor-num-gpus-per-node", "3", "--tensor-model-parallel-size", "3"],
     "8 KV heads (num_key_value_heads of the HF config, Megatron's --num-query-groups) and "
     "--tensor-model-parallel-size 3: one must divide the other"),
    ("tiny_qwen3", ["--colocate", "--rollout-num-gpus", "8", "--rollout-num-gpus-per-engine", "8"],
     "4 attention heads (num_attention_heads of the HF config) do not divide over SGLang's attention tensor "
     "parallel size (--rollout-num-gpus-per-engine 8)"),
    ("heads24", ["--colocate", "--rollout-num-gpus", "8", "--rollout-num-gpus-per-engine", "8"],
     "12 KV heads (num_key_value_heads of the HF config) and SGLang's attention tensor parallel size "
     "(--rollout-num-gpus-per-engine 8): one must divide the other (SGLang splits or replicates KV heads)"),
    ("tiny_qwen3", ["--colocate", "--rollout-num-gpus", "8", "--rollout-num-gpus-per-engine", "8",
                    "--sglang-enable-dp-attention", "--sglang-dp-size", "3"],
     "--sglang-dp-size 3 does not divide --rollout-num-gpus-per-engine 8"),
    ("heads24", ["--actor-num-gpus-per-node", "4", "--pipeline-model-parallel-size", "4"],
     "6 layers (num_hidden_layers of the HF config) do not divide over --pipeline-model-parallel-size 4 (set "
     "--decoder-first/last-pipeline-num-layers for uneven stages)"),
    ("heads24", ["--actor-num-gpus-per-node", "4", "--pipeline-model-parallel-size", "4",
                 "--decoder-first-pipeline-num-layers", "1"],
     "6 layers (num_hidden_layers of the HF config) do not divide over --pipeline-model-parallel-size 4, "
     "--decoder-first-pipeline-num-layers 1 (set"),
    ("tiny_qwen3_moe", ["--actor-num-gpus-per-node", "3", "--expert-model-parallel-size", "3",
                        "--rollout-batch-size", "3"],
     "4 experts (num_local_experts of the HF config) do not divide over --expert-model-parallel-size 3"),
    ("tiny_qwen3", ["--actor-num-gpus-per-node", "2", "--expert-model-parallel-size", "2"],
     "--expert-model-parallel-size 2 on a model without routed experts (use 1)"),
    ("tiny_qwen3_moe", ["--actor-num-gpus-per-node", "2", "--expert-model-parallel-size", "4"],
     "--expert-model-parallel-size 4 x --expert-tensor-parallel-size 1 must divide the 2 trainer ranks of a "
     "pipeline stage (--actor-num-nodes x --actor-num-gpus-per-node = 2 over --pipeline-model-parallel-size 1)"),
    ("tiny_qwen3", ["--rollout-num-gpus-per-engine", "0"], "--rollout-num-gpus-per-engine 0 must be positive"),
    ("tiny_qwen3", ["--tensor-model-parallel-size", "0"], "--tensor-model-parallel-size 0 must be positive"),
    ("tiny_qwen3", ["--num-gpus-per-node", "-1"], "--num-gpus-per-node -1 must be positive"),
]  # fmt: skip


@pytest.mark.parametrize(("checkpoint", "extra", "message"), LAYOUT_ERRORS)
def test_every_layout_error_stops_a_real_start(
    request: pytest.FixtureRequest,
    base: list[str],
    capsys: pytest.CaptureFixture[str],
    checkpoint: str,
    extra: list[str],
    message: str,
) -> None:
    flags = with_checkpoint(base, request.getfixturevalue(checkpoint)) + extra
    assert message in refused(flags, capsys)


@pytest.mark.parametrize(("checkpoint", "extra", "message"), LAYOUT_ERRORS)
def test_dry_run_prints_the_plan_and_the_layout_errors(
    request: pytest.FixtureRequest,
    base: list[str],
    capsys: pytest.CaptureFixture[str],
    checkpoint: str,
    extra: list[str],
    message: str,
) -> None:
    flags = with_checkpoint(base, request.getfixturevalue(checkpoint)) + extra + ["--dry-run"]
    with pytest.raises(SystemExit) as exit_:
        parse_args(flags)
    out = capsys.readouterr()
    if "must be positive" in message:  # refused before there is a plan to print
        assert exit_.value.code == 2 and message in out.err
        return
    assert exit_.value.code == 1, out
    assert "placement:" in out.out and f"error: {message}" in out.out and "problem(s)" in out.out


def test_every_problem_is_named_at_once(base: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(base + ["--rollout-num-gpus", "5", "--rollout-num-gpus-per-engine", "3"], capsys)
    assert "this layout cannot be placed" in err
    assert "--rollout-num-gpus 5 is not a multiple of --rollout-num-gpus-per-engine 3" in err
    assert "--rollout-num-gpus-per-engine 3 does not divide --num-gpus-per-node 8" in err
    assert "do not divide over SGLang's attention tensor parallel size (--rollout-num-gpus-per-engine 3)" in err


# (checkpoint fixture, extra flags) of layouts that can be placed.
VALID_LAYOUTS = [
    ("tiny_qwen3", []),  # the CPU demo's layout: one trainer rank, one engine of one device
    ("tiny_qwen3", ["--actor-num-gpus-per-node", "2", "--tensor-model-parallel-size", "2", "--colocate",
                    "--rollout-num-gpus", "4", "--rollout-num-gpus-per-engine", "2"]),
    # Disaggregated over nodes of 4: the trainer's node, then two engines of 4 on nodes of their own.
    ("tiny_qwen3", ["--actor-num-gpus-per-node", "4", "--tensor-model-parallel-size", "2",
                    "--num-gpus-per-node", "4", "--num-nodes", "3", "--rollout-num-gpus", "8",
                    "--rollout-num-gpus-per-engine", "4"]),
    # Engines wider than a node span whole nodes; the trainer fills whole nodes first.
    ("heads24", ["--actor-num-nodes", "2", "--actor-num-gpus-per-node", "4", "--num-gpus-per-node", "4",
                 "--rollout-num-gpus", "24", "--rollout-num-gpus-per-engine", "12"]),
    # Uneven pipeline stages; KV heads fewer than the engine's TP are replicated (SGLang) / shared (Megatron).
    ("heads24", ["--actor-num-gpus-per-node", "4", "--pipeline-model-parallel-size", "4",
                 "--decoder-first-pipeline-num-layers", "3", "--decoder-last-pipeline-num-layers", "1"]),
    ("tiny_qwen3", ["--actor-num-gpus-per-node", "4", "--tensor-model-parallel-size", "4",
                    "--rollout-num-gpus", "4", "--rollout-num-gpus-per-engine", "4"]),
    # SGLang's DP attention splits the heads over TP / dp-size.
    ("tiny_qwen3", ["--colocate", "--rollout-num-gpus", "8", "--rollout-num-gpus-per-engine", "8",
                    "--sglang-enable-dp-attention", "--sglang-dp-size", "2"]),
    ("tiny_qwen3_moe", ["--actor-num-gpus-per-node", "4", "--expert-model-parallel-size", "4"]),
]  # fmt: skip


@pytest.mark.parametrize(("checkpoint", "extra"), VALID_LAYOUTS)
def test_valid_layouts_start_and_dry_run_clean(
    request: pytest.FixtureRequest,
    base: list[str],
    capsys: pytest.CaptureFixture[str],
    checkpoint: str,
    extra: list[str],
) -> None:
    flags = with_checkpoint(base, request.getfixturevalue(checkpoint)) + extra
    args = parse_args(flags)
    assert args.plan_warnings == [] and "warning" not in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        parse_args(flags + ["--dry-run"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0, out
    assert "dry run: OK, nothing started" in out


def test_memory_estimate_warns_at_a_real_start_and_fails_a_dry_run(
    base: list[str], heads24: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The layout is fine; only the estimate on an assumed 0.01 GiB GPU is over budget.
    flags = with_checkpoint(base, heads24) + ["--gpu-memory-gb", "0.01"]
    args = parse_args(flags)
    err = capsys.readouterr().err
    assert len(args.plan_warnings) == 2 and all(w in err for w in args.plan_warnings)
    assert "warning: training needs about" in err and "raise --rollout-num-gpus-per-engine" in err
    assert "estimate for GPUs of --gpu-memory-gb 0.01 GiB" in err and "does not apply" in err
    with pytest.raises(SystemExit) as exit_:
        parse_args(flags + ["--dry-run"])
    out = capsys.readouterr().out
    assert exit_.value.code == 1
    assert "error: training needs about" in out and "dry run: 2 problem(s)" in out


# Every reference config as its checkpoint has it (its own config code included), read by the planner as loaded:
# the outer config of a multimodal checkpoint, the checkpoint's standalone config class. The count is held to
# transformers' own model of the same architecture, built on the meta device (no memory).
_TRANSFORMERS_CLASS_OF_CUSTOM_CODE = {"kimi-k2": "DeepseekV3", "moonlight": "DeepseekV3", "minimax-m2": "MiniMaxM2",
                                      "mimo-7B-rl": "Qwen2"}  # fmt: skip


def _transformers_counts(model: str, path: Path) -> tuple[int, int]:
    """(all parameters, routed-expert parameters) of transformers' language model of `model`, MTP layers aside."""
    import torch

    with torch.device("meta"):
        if model in _TRANSFORMERS_CLASS_OF_CUSTOM_CODE:  # the checkpoint's fields in transformers' own class
            name = _TRANSFORMERS_CLASS_OF_CUSTOM_CODE[model]
            fields = {k: v for k, v in published_config(model).items() if k not in ("auto_map", "model_type")}
            built = getattr(transformers, f"{name}ForCausalLM")(getattr(transformers, f"{name}Config")(**fields))
        else:
            built = transformers.AutoModelForCausalLM.from_config(
                text_config(transformers.AutoConfig.from_pretrained(path))
            )
    params = [(name, p.numel()) for name, p in built.named_parameters() if ".mtp" not in name]
    return sum(n for _, n in params), sum(n for name, n in params if ".experts." in name)


def plan_args(**kw: object) -> SimpleNamespace:
    """A cluster of 8-GPU nodes, 64 trainer ranks colocated with engines of 8: what make_plan reads."""
    base = dict(
        actor_num_nodes=8, actor_num_gpus_per_node=8, world_size=64, num_gpus_per_node=8, num_nodes=None,
        colocate=True, rollout_num_gpus=64, rollout_num_gpus_per_engine=8, tensor_model_parallel_size=8,
        pipeline_model_parallel_size=1, context_parallel_size=1, expert_model_parallel_size=1,
        expert_tensor_parallel_size=1, decoder_first_pipeline_num_layers=None, decoder_last_pipeline_num_layers=None,
        bf16=True, use_distributed_optimizer=True, optimizer_cpu_offload=False, max_tokens_per_gpu=4096,
        gpu_memory_gb=80.0, sglang_server_args=[], rollout_max_response_len=1024, rollout_max_prompt_len=None,
        debug_train_only=False,
    )  # fmt: skip
    return SimpleNamespace(**{**base, **kw})


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, Any]]:
    """model -> (its checkpoint directory, its config as the engine loads it)."""
    root = tmp_path_factory.mktemp("reference")
    return lambda model: (root / model, load_hf_config(write_reference_config(model, root / model)))


def _text_fields(path: Path) -> dict:
    """The config.json's language-model fields (nested under text_config for Qwen3.5) as written in the file."""
    config = json.loads((path / "config.json").read_text())
    return config.get("text_config", config)


@pytest.mark.parametrize("model", REFERENCE_CONFIGS)
def test_planner_counts_every_reference_config_as_transformers_does(
    model: str, reference: Callable[[str], tuple[Path, Any]]
) -> None:
    path, config = reference(model)
    size = model_size(config)
    total, experts = _transformers_counts(model, path)
    # Within 0.2%: GLM-5's DSA indexer (0.1%) and a few biases and norms are left out of the count.
    assert size.total == pytest.approx(total, rel=2e-3)
    assert size.expert_params == pytest.approx(experts, rel=1e-9)
    line = make_plan(plan_args(), config).lines[0]
    assert line.startswith(f"model: {_text_fields(path)['model_type']}, ")
    assert f"{size.total / 1e9:.2f}B parameters ({experts / 1e9:.2f}B in routed experts)" in line


@pytest.mark.parametrize("model", REFERENCE_CONFIGS)
def test_layout_checks_read_every_reference_config(model: str, reference: Callable[[str], tuple[Path, Any]]) -> None:
    """TP and EP of 7 divide no reference model's heads or experts: each check names the numbers of the published
    config.json, found under the name that config uses."""
    path, config = reference(model)
    fields = _text_fields(path)
    heads, layers = fields["num_attention_heads"], fields["num_hidden_layers"]
    expert_names = [name for name in ("n_routed_experts", "num_local_experts", "num_experts") if fields.get(name)]
    problems = make_plan(plan_args(tensor_model_parallel_size=7, expert_model_parallel_size=7, world_size=63,
                                   actor_num_gpus_per_node=7, actor_num_nodes=9), config).problems  # fmt: skip
    assert f"{heads} attention heads (num_attention_heads of the HF config) do not divide over " in problems[0]
    if expert_names:
        want = f"{fields[expert_names[0]]} experts ({expert_names[0]} of the HF config) do not divide over "
        assert any(p.startswith(want) for p in problems), problems
    else:
        assert "--expert-model-parallel-size 7 on a model without routed experts (use 1)" in problems
    deeper = plan_args(pipeline_model_parallel_size=layers + 1, world_size=8 * (layers + 1))
    want = f"{layers} layers (num_hidden_layers of the HF config) do not divide over --pipeline-model-parallel-size"
    assert any(p.startswith(want) for p in layout_problems(deeper, config))


def test_debug_train_only_plans_no_engine(reference: Callable[[str], tuple[Path, Any]]) -> None:
    """--debug-train-only (slime's SFT scripts) starts no SGLang engine: no rollout layout or memory to check."""
    _, config = reference("qwen3.5-35B-A3B")
    cramped = dict(rollout_num_gpus=1, rollout_num_gpus_per_engine=1, colocate=False, world_size=8,
                   actor_num_nodes=1, tensor_model_parallel_size=2, expert_model_parallel_size=8,
                   optimizer_cpu_offload=True)  # fmt: skip
    served = make_plan(plan_args(**cramped), config)
    assert any("leave KV-cache room for 0 tokens" in m for m in served.memory)  # 64.6 GiB of weights on one GPU
    trained = make_plan(plan_args(**cramped, debug_train_only=True), config)
    assert trained.memory == [] and trained.problems == []
    assert "  rollout: no SGLang engine (--debug-train-only" in "\n".join(trained.lines)
