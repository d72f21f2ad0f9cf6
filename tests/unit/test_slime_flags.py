"""Flags of slime's launch scripts: script-style argument lists parse and dry-run; honoured flags reach the
optimizer settings and the TransformerConfig overrides; no-op flags are named in one start-up line."""

from __future__ import annotations

import json
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


SLIME_HOOKS = """
def tis(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, **kwargs):
    return pg_loss, loss_masks, {}


def reducer(total_lengths, response_lengths, loss_masks, calculate_per_token_loss):
    return lambda x: x.sum()
"""


@pytest.fixture
def slime_hooks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "slime_flag_hooks.py").write_text(SLIME_HOOKS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "slime_flag_hooks"


def test_slime_algorithm_and_weight_flags_parse_with_slime_meaning(base: list[str], slime_hooks: str) -> None:
    args = parse_args(base + [
        "--update-weight-mode", "full", "--update-weight-transport", "nccl", "--model-name", "Qwen3Config",
        "--disable-rewards-normalization", "--use-kl-loss", "--use-unbiased-kl", "--get-mismatch-metrics",
        "--use-opsm", "--opsm-delta", "0.01", "--custom-tis-function-path", f"{slime_hooks}.tis",
        "--custom-pg-loss-reducer-function-path", f"{slime_hooks}.reducer",
    ])  # fmt: skip
    assert args.update_weight_transport == "distributed"  # slime's nccl is our broadcast transport
    assert args.rewards_normalization is False and args.use_unbiased_kl and args.use_opsm and args.opsm_delta == 0.01
    assert args.use_tis  # slime runs its TIS path for --get-mismatch-metrics too
    assert parse_args(base + ["--model-name", "qwen3-4b"]).model_name == "qwen3-4b"


def test_defaults_equal_slime(base: list[str]) -> None:
    args = parse_args(base)
    assert args.input_key == "input" and args.label_key is None
    assert args.sglang_server_concurrency == 512 and args.use_distributed_optimizer is True
    assert args.rewards_normalization is True and args.update_weight_mode == "full" and args.num_epoch is None
    assert parse_args(base + ["--no-use-distributed-optimizer"]).use_distributed_optimizer is False


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--use-opd", "--opd-type", "sglang"], "--use-opd: on-policy distillation is not supported"),
        (["--opd-teacher-load", "/t"], "--opd-teacher-load: on-policy distillation is not supported"),
        (["--megatron-config-path", "m.yaml"], "--megatron-config-path (slime's per-role Megatron YAML)"),
        (["--update-weight-mode", "delta"], "--update-weight-mode delta is not supported"),
        (["--update-weight-disk-dir", "/w"], "--update-weight-disk-dir configures slime's disk/delta weight update"),
        (["--update-weight-delta-encoding", "xor"], "--update-weight-delta-encoding configures"),
        (["--model-name", "llama"], "--model-name llama names another model than the HF config's model_type"),
        (["--model-name", "qwen3_moe"], "--model-name qwen3_moe names another model"),
        (["--custom-tis-function-path", "a.b"], "--custom-tis-function-path replaces the TIS weights: it needs"),
        (["--use-unbiased-kl"], "--use-unbiased-kl weighs the KL loss: it needs --use-kl-loss"),
        (["--get-mismatch-metrics", "--use-mis"], "--get-mismatch-metrics applies slime's TIS weights"),
        (
            ["--custom-pg-loss-reducer-function-path", "a.b", "--loss-agg-mode", "seq-mean-token-sum"],
            "replaces slime's reducer",
        ),
        (["--use-tis", "--custom-tis-function-path", "no_such_module.fn"], "--custom-tis-function-path='no_such"),
    ],
)
def test_unsupported_slime_flags_name_the_flag(
    base: list[str], capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    with pytest.raises(SystemExit):
        parse_args(base + extra)
    assert message in capsys.readouterr().err


def _prompts(path: Path, short: int, long: int) -> Path:
    rows = [{"input": f"q{i}", "label": str(i)} for i in range(short)]
    rows += [{"input": "a much longer question " * 8, "label": "x"} for _ in range(long)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_num_epoch_sets_num_rollout_as_slime(tiny_qwen3: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = _prompts(tmp_path / "d.jsonl", short=9, long=3)
    flags = ["--hf-checkpoint", str(tiny_qwen3), "--prompt-data", str(data), "--rollout-batch-size", "4",
             "--n-samples-per-prompt", "2"]  # fmt: skip
    # 12 usable prompts // 4 per rollout = 3 rollouts per epoch, x 2 epochs.
    assert parse_args(flags + ["--num-epoch", "2"]).num_rollout == 6
    # --rollout-max-prompt-len drops the 3 long prompts (as slime's dataset does): 9 // 4 = 2 per epoch.
    assert parse_args(flags + ["--num-epoch", "2", "--rollout-max-prompt-len", "8"]).num_rollout == 4
    assert parse_args(flags + ["--num-epoch", "2", "--num-rollout", "5"]).num_rollout == 5  # slime: epoch ignored
    for extra, message in (
        ([], "set --num-rollout N (rollouts to run) or --num-epoch N"),
        (["--num-epoch", "1", "--rollout-batch-size", "20"], "fewer than one --rollout-batch-size 20"),
    ):
        with pytest.raises(SystemExit):
            parse_args(flags + extra)
        assert message in capsys.readouterr().err


def test_custom_config_path_sets_args_as_slime(base: list[str], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = tmp_path / "custom.yaml"
    config.write_text("eps_clip: 0.3\ntis_level: token\nrs_veto_threshold: 1.0e-4\n")
    args = parse_args(base + ["--eps-clip", "0.1", "--custom-config-path", str(config)])
    assert args.eps_clip == 0.3 and args.eps_clip_high == 0.3  # applied before the checks derive from it
    assert args.tis_level == "token" and args.rs_veto_threshold == 1e-4  # new keys, for plugins
    config.write_text("- not a mapping\n")
    with pytest.raises(SystemExit):
        parse_args(base + ["--custom-config-path", str(config)])
    assert "expected a mapping of argument names" in capsys.readouterr().err


def test_eval_config_as_slime(base: list[str], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = tmp_path / "eval.yaml"
    config.write_text(
        "eval:\n  defaults:\n    n_samples_per_eval_prompt: 4\n    temperature: 0.6\n"
        "  datasets:\n    - name: aime\n      path: aime.jsonl\n"
        "    - name: gsm8k\n      path: gsm8k.jsonl\n      temperature: 0.6\n      max_response_len: 64\n"
    )
    with pytest.raises(SystemExit):  # max_response_len only on one dataset: one value applies to all here
        parse_args(base + ["--eval-config", str(config)])
    assert "'max_response_len' is set for some datasets but not ['aime']" in capsys.readouterr().err
    config.write_text(config.read_text().replace("      max_response_len: 64\n", ""))
    args = parse_args(base + ["--eval-config", str(config), "--eval-prompt-data", "other.jsonl"])
    assert args.eval_datasets == [("aime", "aime.jsonl"), ("gsm8k", "gsm8k.jsonl")]  # replaces --eval-prompt-data
    assert args.eval_temperature == 0.6 and args.n_samples_per_eval_prompt == 4
    for text, message in (
        (config.read_text().replace("temperature: 0.6\n", "temperature: 1.0\n", 1), "'temperature' differs"),
        (config.read_text() + "      rm_type: math\n", "sets 'rm_type', which this engine's eval does not support"),
    ):
        config.write_text(text)
        with pytest.raises(SystemExit):
            parse_args(base + ["--eval-config", str(config)])
        assert message in capsys.readouterr().err


def test_eval_datasets_are_read_with_the_eval_keys(base: list[str], tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from rollout.manager import load_dataset

    rows = tmp_path / "eval.jsonl"
    rows.write_text(json.dumps({"question": "1+1=", "answer": "2"}) + "\n")
    args = parse_args(
        base + ["--eval-prompt-data", str(rows), "--eval-input-key", "question", "--eval-label-key", "answer"]
    )
    tokenizer = AutoTokenizer.from_pretrained(args.hf_checkpoint)
    [prompt] = load_dataset(args, str(rows), tokenizer, evaluation=True).prompts
    assert (prompt.prompt, prompt.label) == ("1+1=", "2")
