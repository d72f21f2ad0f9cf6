"""Flags of slime's launch scripts: script-style argument lists parse and dry-run; honoured flags reach the
optimizer settings and the TransformerConfig overrides; no-op flags are named in one start-up line."""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

import pytest

from slime_like.arguments import parse_args
from slime_like.megatron.flags import model_config_overrides, no_effect_line, optimizer_settings
from slime_like.metrics_log import wandb_init_kwargs
from tools.reference_configs import write_reference_config

# slime's scripts/models/qwen3-4B.sh
QWEN3_4B = ["--swiglu", "--num-layers", "36", "--hidden-size", "2560", "--ffn-hidden-size", "9728",
            "--num-attention-heads", "32", "--group-query-attention", "--num-query-groups", "8",
            "--use-rotary-position-embeddings", "--disable-bias-linear", "--normalization", "RMSNorm",
            "--norm-epsilon", "1e-6", "--rotary-base", "1000000", "--vocab-size", "151936", "--kv-channels", "128",
            "--qk-layernorm"]  # fmt: skip


def grpo_script(hf: Path) -> list[str]:
    """The flag set of slime's scripts/run-qwen3-4B.sh (checkpoint paths left to their own tests)."""
    return [*QWEN3_4B, "--hf-checkpoint", str(hf),
        # ROLLOUT_ARGS
        "--prompt-data", "dapo-math-17k.jsonl", "--input-key", "prompt", "--label-key", "label",
        "--apply-chat-template", "--rollout-shuffle", "--rm-type", "deepscaler", "--num-rollout", "3000",
        "--rollout-batch-size", "32", "--n-samples-per-prompt", "8", "--rollout-max-response-len", "8192",
        "--rollout-temperature", "1", "--global-batch-size", "256", "--balance-data",
        # EVAL_ARGS
        "--eval-interval", "20", "--eval-prompt-data", "aime", "aime-2024.jsonl", "--n-samples-per-eval-prompt", "16",
        "--eval-max-response-len", "16384", "--eval-top-p", "1",
        # PERF_ARGS
        "--tensor-model-parallel-size", "2", "--sequence-parallel", "--pipeline-model-parallel-size", "1",
        "--context-parallel-size", "1", "--expert-model-parallel-size", "1", "--expert-tensor-parallel-size", "1",
        "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
        "--use-dynamic-batch-size", "--max-tokens-per-gpu", "9216",
        # GRPO_ARGS
        "--advantage-estimator", "grpo", "--use-kl-loss", "--kl-loss-coef", "0.00", "--kl-loss-type", "low_var_kl",
        "--entropy-coef", "0.00", "--eps-clip", "0.2", "--eps-clip-high", "0.28",
        # OPTIMIZER_ARGS
        "--optimizer", "adam", "--lr", "1e-6", "--lr-decay-style", "constant", "--weight-decay", "0.1",
        "--adam-beta1", "0.9", "--adam-beta2", "0.98",
        # WANDB_ARGS
        "--use-wandb", "--wandb-project", "slime-dev", "--wandb-group", "qwen3-4B-test", "--wandb-key", "k",
        # SGLANG_ARGS
        "--rollout-num-gpus-per-engine", "2", "--sglang-mem-fraction-static", "0.7",
        # MISC_ARGS
        "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--accumulate-allreduce-grads-in-fp32",
        "--attention-softmax-in-fp32", "--attention-backend", "flash",
        # ray job submit ... train.py
        "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "8", "--colocate", "--rollout-num-gpus", "8",
    ]  # fmt: skip


def dapo_script(hf: Path) -> list[str]:
    """A DAPO run in slime's style: dynamic sampling, clip-higher, steps per rollout, CPU-offloaded Adam."""
    return [*QWEN3_4B, "--hf-checkpoint", str(hf), "--train-backend", "megatron",
        "--prompt-data", "dapo-math-17k.jsonl", "--input-key", "prompt", "--label-key", "label",
        "--apply-chat-template", "--rollout-shuffle", "--rm-type", "dapo", "--num-rollout", "100",
        "--rollout-batch-size", "32", "--n-samples-per-prompt", "16", "--over-sampling-batch-size", "64",
        "--dynamic-sampling-filter-path", "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std",
        "--rollout-max-response-len", "8192", "--rollout-max-context-len", "10240", "--rollout-temperature", "1",
        "--num-steps-per-rollout", "4",
        "--tensor-model-parallel-size", "2", "--sequence-parallel", "--recompute-granularity", "full",
        "--recompute-method", "uniform", "--recompute-num-layers", "1", "--use-dynamic-batch-size",
        "--max-tokens-per-gpu", "9216", "--micro-batch-size", "1", "--log-probs-chunk-size", "1024",
        "--data-pad-size-multiplier", "128",
        "--advantage-estimator", "grpo", "--eps-clip", "0.2", "--eps-clip-high", "0.28", "--entropy-coef", "0",
        "--optimizer", "adam", "--lr", "1e-6", "--lr-decay-style", "constant", "--weight-decay", "0.1",
        "--adam-beta1", "0.9", "--adam-beta2", "0.98", "--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d",
        "--use-precision-aware-optimizer", "--use-distributed-optimizer",
        "--use-wandb", "--wandb-project", "dapo", "--wandb-group", "qwen3-4B-dapo", "--wandb-team", "lab",
        "--wandb-host", "https://wandb.example", "--disable-wandb-random-suffix",
        "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--accumulate-allreduce-grads-in-fp32",
        "--attention-softmax-in-fp32", "--attention-backend", "flash", "--no-gradient-accumulation-fusion",
        "--no-masked-softmax-fusion", "--no-rope-fusion", "--no-check-for-nan-in-loss-and-grad",
        "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "8", "--colocate", "--rollout-num-gpus", "8",
        "--rollout-num-gpus-per-engine", "2", "--sglang-mem-fraction-static", "0.7",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def qwen3_4b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_reference_config("qwen3-4B", tmp_path_factory.mktemp("qwen3-4B"))


@pytest.mark.parametrize("script", [grpo_script, dapo_script])
def test_script_parses_and_dry_runs(script, qwen3_4b: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = parse_args(script(qwen3_4b))
    assert args.recompute_granularity == "full" and args.use_dynamic_batch_size and args.wandb_project != "slime-like"
    with pytest.raises(SystemExit) as exit_:
        parse_args(script(qwen3_4b) + ["--dry-run"])
    assert exit_.value.code == 0, capsys.readouterr()
    assert "dry run: OK, nothing started" in capsys.readouterr().out


def test_grpo_script_values(qwen3_4b: Path) -> None:
    args = parse_args(grpo_script(qwen3_4b))
    assert args.global_batch_size == 256 and args.balance_data and args.offload_rollout is True
    assert model_config_overrides(args, transformer_engine=False, cuda=True) == {
        "recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1,
        "hidden_dropout": 0.0, "attention_dropout": 0.0, "attention_softmax_in_fp32": True,
    }  # fmt: skip
    with_te = model_config_overrides(args, transformer_engine=True, cuda=True)
    assert with_te["attention_backend"] == "flash"
    assert model_config_overrides(args, transformer_engine=False, cuda=False) == {
        "hidden_dropout": 0.0, "attention_dropout": 0.0, "attention_softmax_in_fp32": True,
    }  # fmt: skip
    assert no_effect_line(args, transformer_engine=False, cuda=False) == (
        "accepted without effect here: --attention-backend --recompute-granularity --recompute-method "
        "--recompute-num-layers"
    )
    assert no_effect_line(args, transformer_engine=True, cuda=True) is None


def test_dapo_script_values(qwen3_4b: Path) -> None:
    args = parse_args(dapo_script(qwen3_4b))
    assert args.global_batch_size == 32 * 16 // 4  # --num-steps-per-rollout 4
    assert args.rollout_max_context_len == 10240 and args.rollout_max_prompt_len == 10239
    with_te = model_config_overrides(args, transformer_engine=True, cuda=True)
    assert with_te["gradient_accumulation_fusion"] is False and with_te["masked_softmax_fusion"] is False
    assert with_te["apply_rope_fusion"] is False
    line = no_effect_line(args, transformer_engine=False, cuda=False)
    assert line is not None and line.startswith("accepted without effect here: ")
    named = set(line.removeprefix("accepted without effect here: ").split())
    assert named == {"--no-check-for-nan-in-loss-and-grad", "--data-pad-size-multiplier", "--log-probs-chunk-size",
                     "--attention-backend", "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion",
                     "--no-rope-fusion", "--use-precision-aware-optimizer", "--optimizer-cpu-offload",
                     "--overlap-cpu-optimizer-d2h-h2d", "--recompute-granularity", "--recompute-method",
                     "--recompute-num-layers"}  # fmt: skip
    on_gpu = no_effect_line(args, transformer_engine=True, cuda=True)
    assert on_gpu == (
        "accepted without effect here: --no-check-for-nan-in-loss-and-grad --data-pad-size-multiplier "
        "--log-probs-chunk-size"
    )


def test_optimizer_settings_from_flags(base: list[str]) -> None:
    args = parse_args(base + ["--optimizer", "sgd", "--sgd-momentum", "0.5", "--optimizer-cpu-offload",
                              "--lr-warmup-fraction", "0.5", "--lr-decay-style", "cosine", "--weight-decay", "0.1",
                              "--global-batch-size", "4"])  # fmt: skip
    steps = 8 // 4  # rollout-batch-size 4 x n-samples 2 / global-batch-size 4
    on_cpu = optimizer_settings(args, args.lr, steps, cuda=False)
    assert on_cpu.optimizer == "sgd" and on_cpu.sgd_momentum == 0.5 and on_cpu.weight_decay == 0.1
    assert on_cpu.lr_decay_steps == 3 * 2 and on_cpu.lr_warmup_steps == 3  # 0.5 x 3 rollouts x 2 steps
    assert on_cpu.optimizer_cpu_offload is False  # the optimizer is on the CPU already
    assert optimizer_settings(args, 1e-5, steps, cuda=True).optimizer_cpu_offload is True


def test_num_steps_per_rollout(base: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # base: --rollout-batch-size 4 --n-samples-per-prompt 2 -> 8 samples; k = 2 -> 4 samples per step.
    assert parse_args(base + ["--num-steps-per-rollout", "2"]).global_batch_size == 4
    assert parse_args(base + ["--num-steps-per-rollout", "2", "--global-batch-size", "4"]).global_batch_size == 4
    for extra, message in (
        (["--num-steps-per-rollout", "2", "--global-batch-size", "8"], "means --global-batch-size 4, not 8"),
        (["--num-steps-per-rollout", "3"], "--num-steps-per-rollout 3 must divide the 8 samples"),
    ):
        with pytest.raises(SystemExit):
            parse_args(base + extra)
        assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--recompute-granularty", "full"], "unrecognized arguments: --recompute-granularty full"),
        (["--optimizer", "muon"], "argument --optimizer: invalid choice: 'muon'"),
        (["--enable-mtp-training"], "--enable-mtp-training is not supported"),
        (["--recompute-granularity", "full"], "needs --recompute-method and --recompute-num-layers"),
        (["--recompute-method", "uniform"], "need --recompute-granularity full"),
        (["--hidden-dropout", "1.5"], "--hidden-dropout 1.5 must be in [0, 1)"),
        (["--lr-warmup-fraction", "0.1", "--lr-warmup-iters", "3"], "--lr-warmup-fraction and --lr-warmup-iters"),
        (["--offload-rollout"], "--offload-rollout frees the servers' GPU memory"),
        (["--rollout-max-context-len", "100", "--rollout-max-prompt-len", "100"], "must be below"),
    ],
)
def test_bad_flags_name_the_flag(
    base: list[str], capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    with pytest.raises(SystemExit):
        parse_args(base + extra)
    assert message in capsys.readouterr().err


def test_defaults_change_nothing(base: list[str]) -> None:
    args = parse_args(base)
    assert model_config_overrides(args, transformer_engine=True, cuda=True) == {}
    assert no_effect_line(args, transformer_engine=False, cuda=False) is None
    assert args.offload_rollout is False and args.rollout_max_prompt_len is None


def test_wandb_options() -> None:
    calls = []

    class FakeWandb:
        def login(self, **kw: object) -> None:
            calls.append(kw)

    args = Namespace(wandb_project="p", wandb_group="g", wandb_team="t", wandb_host="h", wandb_key="secret",
                     wandb_random_suffix=True)  # fmt: skip
    kw = wandb_init_kwargs(args, FakeWandb())
    assert calls == [{"key": "secret", "host": "h"}]
    assert kw["project"] == "p" and kw["entity"] == "t" and kw["group"] == "g"
    assert kw["name"].startswith("g_") and len(kw["name"]) == len("g_") + 6
    assert "wandb_key" not in kw["config"]  # the key is not uploaded with the run's config
    args.wandb_random_suffix = False
    assert wandb_init_kwargs(args)["name"] == "g"
