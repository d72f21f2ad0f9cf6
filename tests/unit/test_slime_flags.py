"""Flags of slime's launch scripts: script-style argument lists parse and dry-run; honoured flags reach the
optimizer settings and the TransformerConfig overrides; no-op flags are named in one start-up line."""

from __future__ import annotations

import json
from argparse import Namespace
from collections.abc import Callable
from pathlib import Path

import pytest

from slime_like.arguments import parse_args
from slime_like.metrics_log import wandb_init_kwargs
from slime_like.trainer.megatron.flags import model_config_overrides, no_effect_line, optimizer_settings
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
        (["--enable-mtp-training"], "--enable-mtp-training needs --mtp-num-layers N"),
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
        (["--use-opd"], "--use-opd needs --opd-type: sglang"),
        (["--use-opd", "--opd-type", "megatron"], "--opd-type megatron needs --opd-teacher-load"),
        (["--use-opd", "--opd-type", "megatron", "--opd-teacher-load", "/no/such/t"], "/no/such/t: no such directory"),
        (["--opd-teacher-load", "/t"], "--opd-teacher-load is set but --use-opd is not"),
        (["--prefill-num-servers", "1"], "transfer engine (mooncake or nixl"),
        (["--sglang-config", "groups.yaml"], "--sglang-config groups.yaml: no such file"),
        (["--custom-model-provider-path", "m.provider"], "--custom-model-provider-path is not supported"),
        (["--use-opd", "--opd-type", "sglang", "--opd-teacher-load", "/t"], "--opd-teacher-load is for --opd-type"),
        (["--megatron-config-path", "m.yaml"], "--megatron-config-path (slime's per-role Megatron YAML)"),
        (["--update-weight-mode", "delta"], "--update-weight-mode delta publishes on a shared disk: it needs"),
        (
            ["--update-weight-mode", "delta", "--update-weight-transport", "disk", "--update-weight-disk-dir", "/w"],
            "--update-weight-mode delta needs --update-weight-local-checkpoint-dir",
        ),
        (["--update-weight-local-checkpoint-dir", "/l"], "it needs --update-weight-transport disk, not distributed"),
        (
            ["--update-weight-transport", "disk", "--custom-update-weight-post-write-path", "no_such_mod.hook"],
            "--custom-update-weight-post-write-path='no_such_mod.hook': cannot import module",
        ),
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


def test_eval_config_as_slime(base: list[str], tmp_path: Path) -> None:
    config = tmp_path / "eval.yaml"
    config.write_text(
        "eval:\n  defaults:\n    n_samples_per_eval_prompt: 4\n    temperature: 0.6\n"
        "  datasets:\n    - name: aime\n      path: aime.jsonl\n"
        "    - name: gsm8k\n      path: gsm8k.jsonl\n      temperature: 0.2\n      max_response_len: 64\n"
        "      rm_type: math\n"
    )
    args = parse_args(base + ["--eval-config", str(config), "--eval-prompt-data", "other.jsonl"])
    assert args.eval_datasets == [("aime", "aime.jsonl"), ("gsm8k", "gsm8k.jsonl")]  # replaces --eval-prompt-data
    aime, gsm8k = args.eval_dataset_configs  # each dataset its own values (tests/unit/test_eval_config.py)
    assert (aime.temperature, aime.n_samples_per_eval_prompt, aime.max_response_len) == (0.6, 4, 1024)
    assert (gsm8k.temperature, gsm8k.max_response_len, gsm8k.rm_type) == (0.2, 64, "math")


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


# slime's meanings of --colocate's rollout GPUs, --sequence-parallel at TP 1 and --eval-interval with --eval-config.


def test_colocate_gives_the_rollout_the_trainers_gpus_as_slime(base: list[str], qwen3_4b: Path) -> None:
    # slime/utils/arguments.py: colocated and --rollout-num-gpus unset -> actor_num_gpus_per_node x actor_num_nodes.
    assert parse_args(base + ["--colocate", "--actor-num-gpus-per-node", "2"]).rollout_num_gpus == 2
    assert (
        parse_args(base + ["--colocate", "--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "1"]).rollout_num_gpus
        == 1
    )
    assert parse_args(base + ["--actor-num-gpus-per-node", "2"]).rollout_num_gpus == 1  # apart: slime has no default
    # The case the issue names: engines of 8 GPUs on the trainer's 2 x 8, with no --rollout-num-gpus.
    flags = ["--hf-checkpoint", str(qwen3_4b), *base[2:], "--colocate", "--actor-num-nodes", "2",
             "--actor-num-gpus-per-node", "8", "--rollout-num-gpus-per-engine", "8", "--rollout-batch-size", "16"]  # fmt: skip
    assert parse_args(flags).rollout_num_gpus == 16


def test_sequence_parallel_at_tp_1_is_turned_off_with_one_warning(
    base: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    args = parse_args(base + ["--sequence-parallel"])  # Megatron-LM: off, with a warning, not an error
    assert args.sequence_parallel is False
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("warning: --sequence-parallel is off: --tensor-model-parallel-size")
    two = parse_args(
        base + ["--sequence-parallel", "--tensor-model-parallel-size", "2", "--actor-num-gpus-per-node", "2"]
    )
    assert two.sequence_parallel is True and "sequence-parallel" not in capsys.readouterr().err


def test_eval_interval_takes_the_datasets_of_eval_config(
    base: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "eval.yaml"
    config.write_text("eval:\n  datasets:\n    - name: aime\n      path: aime.jsonl\n")
    args = parse_args(base + ["--eval-interval", "5", "--eval-config", str(config)])
    assert args.eval_interval == 5 and args.eval_datasets == [("aime", "aime.jsonl")]
    with pytest.raises(SystemExit):
        parse_args(base + ["--eval-interval", "5"])
    assert "--eval-interval needs eval datasets: --eval-prompt-data NAME PATH or --eval-config YAML" in (
        capsys.readouterr().err
    )


# The architecture flags of slime's scripts/models/<model>.sh for the newer families, transcribed (bash loops and
# arithmetic expanded), each checked against the published config.json (tools/reference_configs.py).
_DS_ROUTER = [
    "--moe-router-score-function",
    "sigmoid",
    "--moe-router-pre-softmax",
    "--moe-router-enable-expert-bias",
    "--moe-router-bias-update-rate",
    "0",
    "--moe-router-load-balancing-type",
    "seq_aux_loss",
    "--moe-aux-loss-coeff",
    "0",
    "--moe-router-dtype",
    "fp32",
    "--moe-grouped-gemm",
    "--moe-permute-fusion",
]
_KIMI_LIKE = [
    "--disable-bias-linear",
    "--num-layers",
    "{layers}",
    "--hidden-size",
    "{hidden}",
    "--ffn-hidden-size",
    "{ffn}",
    "--num-attention-heads",
    "{heads}",
    "--kv-channels",
    "{kv}",
    "--normalization",
    "RMSNorm",
    "--position-embedding-type",
    "rope",
    "--norm-epsilon",
    "{eps}",
    "--swiglu",
    "--untie-embeddings-and-output-weights",
    "--vocab-size",
    "163840",
    "--multi-latent-attention",
    "--kv-lora-rank",
    "512",
    "--qk-head-dim",
    "128",
    "--qk-pos-emb-head-dim",
    "64",
    "--v-head-dim",
    "128",
    "--qk-layernorm",
    "--rotary-scaling-factor",
    "{factor}",
    "--rotary-base",
    "50000",
    "--mscale",
    "1.0",
    "--mscale-all-dim",
    "1.0",
    "--attention-softmax-in-fp32",
    "--no-rope-fusion",
    "--num-experts",
    "{experts}",
    "--moe-layer-freq",
    "{freq}",
    "--moe-ffn-hidden-size",
    "{moe_ffn}",
    "--moe-router-topk",
    "{topk}",
    "--moe-shared-expert-intermediate-size",
    "{shared}",
    *_DS_ROUTER,
    "--moe-token-dispatcher-type",
    "alltoall",
    "--moe-router-group-topk",
    "1",
    "--moe-router-num-groups",
    "1",
    "--moe-router-topk-scaling-factor",
    "{scaling}",
]
_QWEN_NEXT_LIKE = [
    "--disable-bias-linear",
    "--qk-layernorm",
    "--group-query-attention",
    "--num-attention-heads",
    "{heads}",
    "--num-query-groups",
    "{groups}",
    "--kv-channels",
    "256",
    "--num-layers",
    "{layers}",
    "--hidden-size",
    "{hidden}",
    "--ffn-hidden-size",
    "{ffn}",
    "--use-gated-attention",
    "--normalization",
    "RMSNorm",
    "--apply-layernorm-1p",
    "--position-embedding-type",
    "rope",
    "--norm-epsilon",
    "1e-6",
    "--rotary-percent",
    "0.25",
    "--swiglu",
    "--vocab-size",
    "{vocab}",
    "--rotary-base",
    "10000000",
    "--attention-output-gate",
]


def _fill(template: list[str], **values: object) -> list[str]:
    return [item.format(**values) if "{" in item else item for item in template]


def _first_dense(layers: int) -> str:
    return "[0," + ",".join(["1"] * (layers - 1)) + "]"  # slime's printf of FIRST_K_DENSE_REPLACE=1


def _moe_all(layers: int) -> str:
    return "[" + ",".join(["1"] * layers) + "]"  # slime's printf of FIRST_K_DENSE_REPLACE=0


SLIME_MODEL_FILES: dict[str, list[str]] = {
    "glm4.7-flash": [  # slime's glm4.7-30B-A3B.sh
        "--moe-layer-freq", "[0]*1+[1]*46", "--num-experts", "64", "--moe-shared-expert-intermediate-size", "1536",
        "--moe-router-topk", "4", "--moe-grouped-gemm", "--moe-permute-fusion", "--moe-ffn-hidden-size", "1536",
        "--moe-router-score-function", "sigmoid", "--moe-router-pre-softmax", "--moe-router-enable-expert-bias",
        "--moe-router-bias-update-rate", "0", "--moe-router-load-balancing-type", "seq_aux_loss",
        "--moe-router-topk-scaling-factor", "1.8", "--moe-aux-loss-coeff", "0", "--moe-router-dtype", "fp32",
        "--make-vocab-size-divisible-by", "64", "--num-layers", "47", "--hidden-size", "2048", "--ffn-hidden-size",
        "10240", "--num-attention-heads", "20", "--disable-bias-linear", "--add-qkv-bias", "--swiglu",
        "--untie-embeddings-and-output-weights", "--position-embedding-type", "rope", "--no-position-embedding",
        "--normalization", "RMSNorm", "--qk-layernorm", "--multi-latent-attention", "--q-lora-rank", "768",
        "--kv-lora-rank", "512", "--qk-head-dim", "192", "--v-head-dim", "256", "--kv-channels", "192",
        "--qk-pos-emb-head-dim", "64", "--vocab-size", "154880", "--rotary-base", "1000000", "--no-rope-fusion"],
    "glm4.7-355B-A32B": [  # slime's glm4.5-355B-A32B.sh, which slime's run-glm4.7-355B-A32B.sh sources
        "--disable-bias-linear", "--qk-layernorm", "--group-query-attention", "--num-attention-heads", "96",
        "--num-query-groups", "8", "--kv-channels", "128", "--num-layers", "92", "--hidden-size", "5120",
        "--ffn-hidden-size", "12288", "--add-qkv-bias", "--normalization", "RMSNorm", "--position-embedding-type",
        "rope", "--rotary-percent", "0.5", "--swiglu", "--untie-embeddings-and-output-weights", "--vocab-size",
        "151552", "--rotary-base", "1000000", "--moe-ffn-hidden-size", "1536", "--moe-shared-expert-intermediate-size",
        "1536", *_DS_ROUTER, "--moe-token-dispatcher-type", "alltoall", "--moe-router-topk", "8",
        "--moe-router-topk-scaling-factor", "2.5", "--moe-layer-freq", "[0]*3+[1]*89", "--num-experts", "160"],
    "glm4.5-106B-A12B": [
        "--disable-bias-linear", "--group-query-attention", "--num-attention-heads", "96", "--num-query-groups", "8",
        "--kv-channels", "128", "--num-layers", "46", "--hidden-size", "4096", "--ffn-hidden-size", "10944",
        "--add-qkv-bias", "--normalization", "RMSNorm", "--position-embedding-type", "rope", "--rotary-percent", "0.5",
        "--swiglu", "--untie-embeddings-and-output-weights", "--vocab-size", "151552", "--rotary-base", "1000000",
        "--moe-ffn-hidden-size", "1408", "--moe-shared-expert-intermediate-size", "1408", *_DS_ROUTER,
        "--moe-token-dispatcher-type", "alltoall", "--moe-router-topk", "8", "--moe-layer-freq", "[0]*1+[1]*45",
        "--num-experts", "128"],
    "glm4-9B": [
        "--spec", "slime_plugins.models.glm4", "get_glm_spec", "--swiglu", "--num-layers", "40", "--hidden-size",
        "4096", "--ffn-hidden-size", "13696", "--num-attention-heads", "32", "--group-query-attention",
        "--num-query-groups", "2", "--use-rotary-position-embeddings", "--disable-bias-linear", "--add-qkv-bias",
        "--normalization", "RMSNorm", "--norm-epsilon", "1e-5", "--rotary-base", "10000", "--vocab-size", "151552",
        "--post-self-attn-layernorm", "--post-mlp-layernorm", "--rotary-interleaved", "--rotary-percent", "0.5",
        "--no-rope-fusion", "--untie-embeddings-and-output-weights"],
    "glm5-744B-A40B": [
        "--spec", "slime_plugins.models.glm5.glm5", "get_glm5_spec", "--moe-layer-freq", "[0]*3+[1]*75",
        "--num-experts", "256", "--moe-shared-expert-intermediate-size", "2048", "--moe-router-topk", "8",
        "--moe-ffn-hidden-size", "2048", *_DS_ROUTER, "--moe-router-topk-scaling-factor", "2.5",
        "--make-vocab-size-divisible-by", "16", "--num-layers", "78", "--hidden-size", "6144", "--ffn-hidden-size",
        "12288", "--num-attention-heads", "64", "--disable-bias-linear", "--swiglu",
        "--untie-embeddings-and-output-weights", "--position-embedding-type", "rope", "--no-position-embedding",
        "--normalization", "RMSNorm", "--qk-layernorm", "--multi-latent-attention", "--q-lora-rank", "2048",
        "--kv-lora-rank", "512", "--qk-head-dim", "192", "--v-head-dim", "256", "--kv-channels", "192",
        "--qk-pos-emb-head-dim", "64", "--vocab-size", "154880", "--rotary-base", "1000000", "--enable-experimental",
        "--allgather-cp"],
    "kimi-k2": [*_fill(_KIMI_LIKE, layers=61, hidden=7168, ffn=18432, heads=64, kv=64, eps="1e-6", factor="32.0",
                       experts=384, moe_ffn=2048, topk=8, shared=2048, scaling="2.827", freq=_first_dense(61)),
                "--q-lora-rank", "1536"],
    "moonlight": [*_fill(_KIMI_LIKE, layers=27, hidden=2048, ffn=11264, heads=16, kv=128, eps="1e-5", factor="1",
                         experts=64, moe_ffn=1408, topk=6, shared=2816, scaling="2.446", freq=_first_dense(27)),
                  "--rotary-percent", "1.0", "--no-masked-softmax-fusion", "--moe-token-drop-policy", "probs"],
    "mimo-7B-rl": [
        "--swiglu", "--num-layers", "36", "--hidden-size", "4096", "--ffn-hidden-size", "11008",
        "--num-attention-heads", "32", "--group-query-attention", "--num-query-groups", "8",
        "--use-rotary-position-embeddings", "--disable-bias-linear", "--add-qkv-bias", "--normalization", "RMSNorm",
        "--norm-epsilon", "1e-05", "--rotary-base", "640000", "--vocab-size", "151680",
        "--untie-embeddings-and-output-weights", "--max-position-embeddings", "32768", "--mtp-num-layers", "1"],
    "minimax-m2": [
        "--spec", "slime_plugins.models.minimax_m2", "get_minimax_m2_layer_spec", "--disable-bias-linear",
        "--num-layers", "62", "--hidden-size", "3072", "--ffn-hidden-size", "1536", "--num-attention-heads", "48",
        "--kv-channels", "128", "--num-query-groups", "8", "--normalization", "RMSNorm", "--position-embedding-type",
        "rope", "--norm-epsilon", "1e-6", "--swiglu", "--untie-embeddings-and-output-weights", "--vocab-size",
        "200064", "--group-query-attention", "--rotary-percent", "0.5", "--rotary-base", "5000000", "--qk-layernorm",
        "--no-rope-fusion", "--attention-softmax-in-fp32", "--num-experts", "256", "--moe-ffn-hidden-size", "1536",
        "--moe-router-topk", "8", "--moe-layer-freq", "[1]*62", "--moe-router-pre-softmax",
        "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
        "--moe-router-load-balancing-type", "none", "--moe-token-dispatcher-type", "alltoall", "--moe-router-dtype",
        "fp32", "--moe-aux-loss-coeff", "0", "--moe-grouped-gemm", "--moe-permute-fusion"],
    "qwen3-next-80B-A3B": [
        "--spec", "slime_plugins.models.qwen3_next", "get_qwen3_next_spec",
        *_fill(_QWEN_NEXT_LIKE, heads=16, groups=2, layers=48, hidden=2048, ffn=5120, vocab=151936),
        "--untie-embeddings-and-output-weights", "--moe-ffn-hidden-size", "512",
        "--moe-shared-expert-intermediate-size", "512", "--moe-router-score-function", "softmax",
        "--moe-token-dispatcher-type", "alltoall", "--moe-router-topk", "10", "--moe-layer-freq", _moe_all(48),
        "--num-experts", "512", "--moe-grouped-gemm", "--moe-token-drop-policy", "probs", "--moe-router-dtype", "fp32",
        "--moe-permute-fusion", "--moe-aux-loss-coeff", "0", "--moe-shared-expert-gate"],
    "qwen3.5-0.8B": ["--spec", "slime_plugins.models.qwen3_5", "get_qwen3_5_spec",
                     *_fill(_QWEN_NEXT_LIKE, heads=8, groups=2, layers=24, hidden=1024, ffn=3584, vocab=248320)],
    "qwen3.5-9B": ["--spec", "slime_plugins.models.qwen3_5", "get_qwen3_5_spec",
                   *_fill(_QWEN_NEXT_LIKE, heads=16, groups=4, layers=32, hidden=4096, ffn=12288, vocab=248320),
                   "--untie-embeddings-and-output-weights"],
    "qwen3.5-27B": ["--spec", "slime_plugins.models.qwen3_5", "get_qwen3_5_spec",
                    *_fill(_QWEN_NEXT_LIKE, heads=24, groups=4, layers=64, hidden=5120, ffn=17408, vocab=248320),
                    "--untie-embeddings-and-output-weights"],
    "qwen3.5-35B-A3B": [
        "--spec", "slime_plugins.models.qwen3_5", "get_qwen3_5_spec",
        *_fill(_QWEN_NEXT_LIKE, heads=16, groups=2, layers=40, hidden=2048, ffn=512, vocab=248320),
        "--untie-embeddings-and-output-weights", "--moe-ffn-hidden-size", "512",
        "--moe-shared-expert-intermediate-size", "512", "--moe-router-score-function", "softmax",
        "--moe-token-dispatcher-type", "alltoall", "--moe-router-topk", "8", "--moe-layer-freq", _moe_all(40),
        "--num-experts", "256", "--moe-grouped-gemm", "--moe-token-drop-policy", "probs", "--moe-router-dtype", "fp32",
        "--moe-permute-fusion", "--moe-aux-loss-coeff", "0", "--moe-shared-expert-gate"],
}  # fmt: skip

# Families the registry gains in this round (slime_like/trainer/megatron/families.py): each start passes once its family is
# registered and ends with the family error until then. The others are not planned: their start must end with it.
PENDING_FAMILIES = {"glm4_moe_lite", "glm4_moe", "kimi_k2", "glm4", "mimo", "minimax_m2", "qwen3_next", "qwen3_5",
                    "qwen3_5_moe", "glm_moe_dsa"}  # fmt: skip
UNSUPPORTED_FAMILIES: set[str] = set()
_DENSE_LAYOUT = ["--actor-num-gpus-per-node", "8", "--tensor-model-parallel-size", "2"]
_MOE_LAYOUT = ["--actor-num-nodes", "4", "--actor-num-gpus-per-node", "8", "--tensor-model-parallel-size", "2",
               "--expert-model-parallel-size", "32", "--expert-tensor-parallel-size", "1", "--optimizer-cpu-offload"]  # fmt: skip
_DENSE_MODELS = {"glm4-9B", "mimo-7B-rl", "qwen3.5-0.8B", "qwen3.5-9B", "qwen3.5-27B"}
# slime's run-qwen3.5-27B.sh layout (TP4 x PP2, optimizer on the CPU): TP2 alone needs 123 GiB per GPU.
_LAYOUT_OF = {"qwen3.5-27B": ["--actor-num-gpus-per-node", "8", "--tensor-model-parallel-size", "4",
                              "--pipeline-model-parallel-size", "2", "--optimizer-cpu-offload"]}  # fmt: skip


def _registered(model_type: str) -> bool:
    from slime_like.trainer.megatron.families import FAMILIES

    return model_type in FAMILIES


def _expect_start(argv: list[str], model_type: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A dry run passes when the family is registered; otherwise it ends with the family error (exit 2)."""
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv + ["--dry-run"])
    out = capsys.readouterr()
    if model_type in PENDING_FAMILIES and _registered(model_type):
        assert exit_.value.code == 0, out.out + out.err
        assert "dry run: OK, nothing started" in out.out
    else:
        assert exit_.value.code == 2, out.out + out.err
        assert f"(model_type {model_type!r}), which this engine cannot train yet: no model family is registered" in (
            out.err
        ), out.err
        assert "contradict" not in out.err and "cannot be placed" not in out.err  # every earlier check passed


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    root = tmp_path_factory.mktemp("published")
    return lambda model: write_reference_config(model, root / model) if not (root / model).exists() else root / model


@pytest.mark.parametrize(
    "model", sorted(set(SLIME_MODEL_FILES) - {"glm4.7-flash", "glm4.7-355B-A32B", "kimi-k2", "glm5-744B-A40B"})
)
def test_slime_model_files_of_new_families_start(
    model: str, published: Callable[[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """slime's model file on a layout that fits (the models with a launch script below start with its layout)."""
    hf = published(model)
    model_type = json.loads((hf / "config.json").read_text())["model_type"]
    assert model_type in PENDING_FAMILIES | UNSUPPORTED_FAMILIES | {"deepseek_v3"}
    layout = _LAYOUT_OF.get(model) or (_DENSE_LAYOUT if model in _DENSE_MODELS else _MOE_LAYOUT)
    argv = [*SLIME_MODEL_FILES[model], "--hf-checkpoint", str(hf), "--prompt-data", "p.jsonl", "--num-rollout", "10",
            "--rollout-batch-size", "8", "--n-samples-per-prompt", "8", "--colocate", *layout,
            "--rollout-num-gpus-per-engine", "8"]  # fmt: skip
    if model_type == "deepseek_v3":  # Moonlight: a registered family since DeepSeek-V3
        with pytest.raises(SystemExit) as exit_:
            parse_args(argv + ["--dry-run"])
        assert exit_.value.code == 0 and "dry run: OK" in capsys.readouterr().out
        return
    _expect_start(argv, model_type, capsys)


@pytest.mark.parametrize(
    ("model", "flag", "wrong", "message"),
    [
        ("glm4.7-flash", "--moe-router-topk-scaling-factor", "2.5", "contradicts routed_scaling_factor=1.8"),
        ("glm4.7-flash", "--moe-layer-freq", "[0]*3+[1]*44", "makes layers [0, 1, 2] dense but the HF config"),
        ("glm4.7-355B-A32B", "--rotary-percent", "1.0", "--rotary-percent 1.0 contradicts partial_rotary_factor=0.5"),
        ("glm4.7-355B-A32B", "--num-query-groups", "4", "--num-query-groups 4 contradicts num_key_value_heads=8"),
        ("kimi-k2", "--rotary-scaling-factor", "40", "contradicts rope_scaling.factor=32.0"),
        (
            "qwen3.5-35B-A3B",
            "--num-attention-heads",
            "32",
            "--num-attention-heads 32 contradicts num_attention_heads=16",
        ),
        ("qwen3.5-35B-A3B", "--rotary-base", "1000000", "contradicts rope_theta=10000000"),
        ("qwen3-next-80B-A3B", "--rotary-percent", "0.5", "contradicts partial_rotary_factor=0.25"),
        ("qwen3-next-80B-A3B", "--num-experts", "256", "--num-experts 256 contradicts num_experts=512"),
        ("mimo-7B-rl", "--mtp-num-layers", "2", "--mtp-num-layers 2 contradicts num_nextn_predict_layers=1"),
        ("minimax-m2", "--rotary-percent", "0.25", "contradicts rotary_dim / head_dim=0.5"),
        # MiniMax-M2 has no moe_intermediate_size: its experts are intermediate_size wide.
        ("minimax-m2", "--moe-ffn-hidden-size", "2048", "2048 contradicts intermediate_size=1536"),
    ],
)
def test_new_family_flags_are_checked_against_the_config(
    model: str, flag: str, wrong: str, message: str, published: Callable[[str], Path],
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    argv = list(SLIME_MODEL_FILES[model])
    argv[argv.index(flag) + 1] = wrong
    with pytest.raises(SystemExit):
        parse_args(
            [
                *argv,
                "--hf-checkpoint",
                str(published(model)),
                "--prompt-data",
                "p.jsonl",
                "--num-rollout",
                "1",
                "--rollout-batch-size",
                "1",
            ]
        )
    assert message in capsys.readouterr().err


def test_missing_switches_of_the_family_are_named(published: Callable[[str], Path], capsys) -> None:
    argv = [a for a in SLIME_MODEL_FILES["glm4.7-355B-A32B"] if a not in ("--qk-layernorm", "--add-qkv-bias")]
    with pytest.raises(SystemExit):
        parse_args(
            [
                *argv,
                "--hf-checkpoint",
                str(published("glm4.7-355B-A32B")),
                "--prompt-data",
                "p",
                "--num-rollout",
                "1",
                "--rollout-batch-size",
                "1",
            ]
        )
    err = capsys.readouterr().err
    assert "--qk-layernorm is missing but the HF config has use_qk_norm=True" in err
    assert "--add-qkv-bias is missing but the HF config has attention_bias / model_type=True" in err


def test_kimi_config_is_custom_code_read_as_slime_reads_it(published: Callable[[str], Path]) -> None:
    import transformers

    from slime_like.trainer.model_arguments import read_hf_config

    hf = published("kimi-k2")
    assert json.loads((hf / "config.json").read_text())["auto_map"]["AutoConfig"] == (
        "configuration_deepseek.DeepseekV3Config"
    )
    with pytest.raises(ValueError):  # custom code: only with trust_remote_code, as the real checkpoint
        transformers.AutoConfig.from_pretrained(hf, trust_remote_code=False)
    config = read_hf_config(str(hf))
    # The checkpoint's own class (configuration_deepseek.py, written for transformers 4), not transformers' class.
    assert config.model_type == "kimi_k2" and type(config).__module__.endswith("configuration_deepseek")
    assert not isinstance(config, transformers.DeepseekV3Config) and not type(config).attribute_map


# slime's launch scripts for these families (checkpoint paths left to their own tests; dry runs on the published
# config.json). MTP training (slime's MTP_ARGS): tests/unit/test_mtp_flags.py.
SLIME_RUNS: dict[str, list[str]] = {
    "glm4.7-flash": [  # scripts/run-glm4.7-30B-A3B.sh (EP 4: its EP 8 x PP 2 needs 16 ranks, Megatron refuses 8)
        "--prompt-data", "dapo-math-17k.jsonl", "--input-key", "prompt", "--label-key", "label",
        "--apply-chat-template", "--rollout-shuffle", "--rm-type", "deepscaler", "--num-rollout", "3000",
        "--rollout-batch-size", "128", "--n-samples-per-prompt", "8", "--rollout-max-response-len", "32768",
        "--rollout-temperature", "1.0", "--global-batch-size", "1024",
        "--eval-interval", "20", "--eval-prompt-data", "aime24", "aime-2024.jsonl", "--n-samples-per-eval-prompt",
        "2", "--eval-max-response-len", "32768", "--eval-temperature", "1.0", "--eval-top-p", "0.95",
        "--tensor-model-parallel-size", "2", "--sequence-parallel", "--pipeline-model-parallel-size", "2",
        "--context-parallel-size", "2", "--expert-model-parallel-size", "4", "--expert-tensor-parallel-size", "1",
        "--decoder-last-pipeline-num-layers", "23", "--recompute-granularity", "full", "--recompute-method",
        "uniform", "--recompute-num-layers", "1", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "32768",
        "--advantage-estimator", "grpo", "--use-kl-loss", "--kl-loss-coef", "0.00", "--kl-loss-type", "low_var_kl",
        "--kl-coef", "0.00", "--entropy-coef", "0.00",
        "--optimizer", "adam", "--lr", "1e-6", "--lr-decay-style", "constant", "--weight-decay", "0.1",
        "--adam-beta1", "0.9", "--adam-beta2", "0.98", "--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d",
        "--use-precision-aware-optimizer",
        "--rollout-num-gpus-per-engine", "8", "--sglang-mem-fraction-static", "0.8", "--sglang-enable-dp-attention",
        "--sglang-dp-size", "8", "--sglang-enable-dp-lm-head", "--sglang-moe-dense-tp-size", "1",
        "--sglang-speculative-algorithm", "EAGLE", "--sglang-speculative-num-steps", "3",
        "--sglang-speculative-eagle-topk", "1", "--sglang-speculative-num-draft-tokens", "4",
        "--sglang-cuda-graph-max-bs", "64", "--sglang-max-running-requests", "512",
        "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--accumulate-allreduce-grads-in-fp32",
        "--attention-softmax-in-fp32", "--attention-backend", "flash", "--moe-token-dispatcher-type", "flex",
        "--moe-enable-deepep",
        "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "8", "--colocate"],
    "glm4.7-355B-A32B": [  # scripts/run-glm4.7-355B-A32B.sh
        "--prompt-data", "dapo-math-17k.jsonl", "--input-key", "prompt", "--label-key", "label",
        "--apply-chat-template", "--rollout-shuffle", "--rm-type", "deepscaler", "--num-rollout", "3000",
        "--rollout-batch-size", "128", "--n-samples-per-prompt", "8", "--rollout-max-response-len", "32768",
        "--rollout-temperature", "1", "--over-sampling-batch-size", "256", "--dynamic-sampling-filter-path",
        "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std", "--num-steps-per-rollout", "4",
        "--balance-data", "--rollout-stop-token-ids", "151329", "151336", "151338",
        "--eval-interval", "20", "--eval-prompt-data", "aime", "aime-2024.jsonl", "--n-samples-per-eval-prompt", "8",
        "--eval-max-response-len", "32768", "--eval-top-p", "1",
        "--tensor-model-parallel-size", "8", "--sequence-parallel", "--pipeline-model-parallel-size", "4",
        "--context-parallel-size", "2", "--expert-model-parallel-size", "16", "--expert-tensor-parallel-size", "1",
        "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
        "--use-dynamic-batch-size", "--max-tokens-per-gpu", "16384",
        "--advantage-estimator", "gspo", "--kl-loss-coef", "0.00", "--kl-loss-type", "low_var_kl", "--kl-coef",
        "0.00", "--entropy-coef", "0.00", "--eps-clip", "1e-4", "--eps-clip-high", "2e-4", "--use-tis",
        "--optimizer", "adam", "--lr", "1e-6", "--lr-decay-style", "constant", "--weight-decay", "0.1",
        "--adam-beta1", "0.9", "--adam-beta2", "0.98", "--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d",
        "--use-precision-aware-optimizer",
        "--rollout-num-gpus-per-engine", "32", "--sglang-mem-fraction-static", "0.7", "--sglang-enable-dp-attention",
        "--sglang-dp-size", "4", "--sglang-ep-size", "32", "--sglang-enable-dp-lm-head", "--sglang-moe-dense-tp-size",
        "1", "--sglang-speculative-algorithm", "EAGLE", "--sglang-speculative-num-steps", "3",
        "--sglang-speculative-eagle-topk", "1", "--sglang-speculative-num-draft-tokens", "4",
        "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--accumulate-allreduce-grads-in-fp32",
        "--attention-softmax-in-fp32", "--attention-backend", "flash", "--moe-token-dispatcher-type", "flex",
        "--moe-enable-deepep",
        "--actor-num-nodes", "8", "--actor-num-gpus-per-node", "8", "--colocate"],
    "kimi-k2": [  # scripts/run-kimi-k2-Instruct.sh
        "--update-weight-buffer-size", str(4 * 512 * 1024 * 1024),
        "--prompt-data", "dapo-math-17k.jsonl", "--input-key", "prompt", "--label-key", "label",
        "--apply-chat-template", "--rollout-shuffle", "--rm-type", "math", "--num-rollout", "100",
        "--rollout-batch-size", "128", "--n-samples-per-prompt", "8", "--rollout-max-response-len", "32768",
        "--rollout-temperature", "1", "--over-sampling-batch-size", "256", "--dynamic-sampling-filter-path",
        "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std", "--num-steps-per-rollout", "4",
        "--balance-data",
        "--eval-interval", "20", "--eval-prompt-data", "aime", "aime-2024.jsonl", "--n-samples-per-eval-prompt", "8",
        "--eval-max-response-len", "32768", "--eval-top-p", "1",
        "--tensor-model-parallel-size", "8", "--sequence-parallel", "--pipeline-model-parallel-size", "8",
        "--context-parallel-size", "4", "--expert-model-parallel-size", "32", "--expert-tensor-parallel-size", "1",
        "--decoder-last-pipeline-num-layers", "5", "--recompute-granularity", "full", "--recompute-method", "uniform",
        "--recompute-num-layers", "1", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "16384",
        "--advantage-estimator", "grpo", "--use-kl-loss", "--kl-loss-coef", "0.00", "--kl-loss-type", "low_var_kl",
        "--entropy-coef", "0.00", "--eps-clip", "0.2", "--eps-clip-high", "0.28",
        "--optimizer", "adam", "--lr", "1e-6", "--lr-decay-style", "constant", "--weight-decay", "0.1",
        "--adam-beta1", "0.9", "--adam-beta2", "0.98", "--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d",
        "--use-precision-aware-optimizer",
        "--rollout-num-gpus-per-engine", "16", "--sglang-mem-fraction-static", "0.7", "--sglang-enable-dp-attention",
        "--sglang-dp-size", "8", "--sglang-moe-dense-tp-size", "1", "--sglang-enable-dp-lm-head", "--sglang-ep-size",
        "16", "--sglang-server-concurrency", "1024",
        "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--accumulate-allreduce-grads-in-fp32",
        "--attention-softmax-in-fp32", "--attention-backend", "flash", "--moe-enable-deepep",
        "--moe-token-dispatcher-type", "flex",
        "--actor-num-nodes", "32", "--actor-num-gpus-per-node", "8", "--colocate",
        # Kimi-K2's published weights are FP8; the plan counts 16-bit serving weights: H200-sized GPUs hold them.
        "--gpu-memory-gb", "141"],
    # scripts/run-glm5-744B-A40B.sh with --context-parallel-size 1 (its CP 2 is refused: test below) and without
    # --prefill-num-servers 1 (prefill/decode disaggregation, refused here with its own message).
    "glm5-744B-A40B": [
        "--update-weight-buffer-size", str(2 * 1024**3),
        "--prompt-data", "dapo-math-17k.jsonl", "--input-key", "prompt", "--label-key", "label",
        "--apply-chat-template", "--rollout-shuffle", "--rm-type", "deepscaler", "--num-rollout", "3000",
        "--rollout-batch-size", "8", "--n-samples-per-prompt", "8", "--rollout-max-response-len", "32768",
        "--rollout-temperature", "1", "--global-batch-size", "64",
        "--tensor-model-parallel-size", "4", "--sequence-parallel", "--pipeline-model-parallel-size", "4",
        "--decoder-last-pipeline-num-layers", "18", "--expert-model-parallel-size", "32",
        "--expert-tensor-parallel-size", "1", "--context-parallel-size", "1",
        "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
        "--use-dynamic-batch-size", "--max-tokens-per-gpu", "16384", "--data-pad-size-multiplier", "4096",
        "--log-probs-chunk-size", "1024",
        "--advantage-estimator", "grpo", "--kl-loss-coef", "0.00", "--kl-loss-type", "low_var_kl", "--kl-coef",
        "0.00", "--entropy-coef", "0.00", "--eps-clip", "0.2", "--eps-clip-high", "0.28",
        "--optimizer", "adam", "--lr", "1e-6", "--lr-decay-style", "constant", "--weight-decay", "0.1",
        "--adam-beta1", "0.9", "--adam-beta2", "0.98", "--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d",
        "--use-precision-aware-optimizer",
        "--rollout-num-gpus-per-engine", "64", "--sglang-mem-fraction-static", "0.70", "--sglang-enable-dp-attention",
        "--sglang-ep-size", "64", "--sglang-dp-size", "64", "--sglang-moe-dense-tp-size", "1",
        "--sglang-enable-dp-lm-head", "--sglang-moe-a2a-backend", "deepep", "--sglang-deepep-mode", "auto",
        "--sglang-speculative-algorithm", "EAGLE", "--sglang-speculative-num-steps", "3",
        "--sglang-speculative-eagle-topk", "1", "--sglang-speculative-num-draft-tokens", "4",
        "--sglang-page-size", "64", "--sglang-nsa-decode-backend", "flashmla_sparse", "--sglang-nsa-prefill-backend",
        "flashmla_sparse", "--sglang-attention-backend", "nsa", "--sglang-cuda-graph-max-bs", "8",
        "--sglang-max-running-requests", "512", "--sglang-chunked-prefill-size", "131072",
        "--sglang-watchdog-timeout", "3600",
        "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--accumulate-allreduce-grads-in-fp32",
        "--attention-softmax-in-fp32", "--attention-backend", "flash", "--moe-enable-deepep",
        "--moe-token-dispatcher-type", "flex",
        "--actor-num-nodes", "32", "--actor-num-gpus-per-node", "8", "--colocate"],
}  # fmt: skip


def test_glm5_launch_script_context_parallel_is_refused(
    published: Callable[[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """slime's GLM-5 run uses --context-parallel-size 2 with its own spec (--allgather-cp); megatron-core's DSA has
    none: the dry run names the flag and the fix."""
    argv = [*SLIME_MODEL_FILES["glm5-744B-A40B"], "--hf-checkpoint", str(published("glm5-744B-A40B"))]
    run = list(SLIME_RUNS["glm5-744B-A40B"])
    run[run.index("--context-parallel-size") + 1] = "2"
    with pytest.raises(SystemExit) as exit_:
        parse_args([*argv, *run, "--dry-run"])
    out = capsys.readouterr().out
    assert exit_.value.code == 1, out
    assert "--context-parallel-size 2: megatron-core 0.16's DeepSeek sparse attention (GLM-5) has no context" in out


@pytest.mark.parametrize("model", sorted(SLIME_RUNS))
def test_slime_launch_scripts_of_new_families_start(
    model: str, published: Callable[[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    hf = published(model)
    argv = [*SLIME_MODEL_FILES[model], "--hf-checkpoint", str(hf), *SLIME_RUNS[model]]
    model_type = json.loads((hf / "config.json").read_text())["model_type"]
    _expect_start(argv, model_type, capsys)
    if _registered(model_type):
        args = parse_args(argv)
        assert args.rollout_num_gpus == args.world_size and args.sequence_parallel  # colocated: the trainer's GPUs
    # slime's MTP_ARGS (GLM-4.7-Flash's script), at each script's PP x CP layout: the GLM checkpoints' MTP layer is
    # trained; Kimi-K2's checkpoint has none, and GLM-5's (DSA attention) is not built.
    mtp = ["--mtp-num-layers", "1", "--enable-mtp-training", "--mtp-loss-scaling-factor", "0.2", "--dry-run"]
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv + mtp)
    out = capsys.readouterr()
    if model in ("glm4.7-flash", "glm4.7-355B-A32B"):
        assert exit_.value.code == 0 and "dry run: OK, nothing started" in out.out, out.out + out.err
    else:
        assert exit_.value.code == 2 and "--enable-mtp-training: " in out.err, out.err


# slime's scripts/run-minimax-m2.sh (checkpoint paths left out as above; slime trains no MTP layer of MiniMax-M2).
SLIME_MINIMAX_M2_RUN = [
    "--model-name", "minimax_m2",
    "--prompt-data", "dapo-math-17k.jsonl", "--input-key", "prompt", "--label-key", "label",
    "--apply-chat-template", "--rollout-shuffle", "--rm-type", "deepscaler", "--num-rollout", "3000",
    "--rollout-batch-size", "128", "--n-samples-per-prompt", "8", "--rollout-max-response-len", "32768",
    "--rollout-temperature", "1", "--over-sampling-batch-size", "256", "--dynamic-sampling-filter-path",
    "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std", "--num-steps-per-rollout", "4",
    "--balance-data",
    "--eval-interval", "20", "--eval-prompt-data", "aime", "aime-2024.jsonl", "--n-samples-per-eval-prompt", "8",
    "--eval-max-response-len", "32768", "--eval-top-p", "1",
    "--tensor-model-parallel-size", "2", "--sequence-parallel", "--pipeline-model-parallel-size", "2",
    "--context-parallel-size", "1", "--expert-model-parallel-size", "4", "--expert-tensor-parallel-size", "1",
    "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
    "--use-dynamic-batch-size", "--max-tokens-per-gpu", "8192",
    "--advantage-estimator", "grpo", "--use-kl-loss", "--kl-loss-coef", "0.00", "--kl-loss-type", "low_var_kl",
    "--entropy-coef", "0.00", "--eps-clip", "0.2", "--eps-clip-high", "0.28",
    "--optimizer", "adam", "--lr", "1e-6", "--lr-decay-style", "constant", "--weight-decay", "0.1",
    "--adam-beta1", "0.9", "--adam-beta2", "0.98", "--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d",
    "--use-precision-aware-optimizer", "--use-tensorboard",
    "--rollout-num-gpus-per-engine", "16", "--sglang-mem-fraction-static", "0.7", "--sglang-ep-size", "16",
    "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--accumulate-allreduce-grads-in-fp32",
    "--attention-softmax-in-fp32", "--attention-backend", "flash",
    "--actor-num-nodes", "16", "--actor-num-gpus-per-node", "8", "--colocate",
    # EP 4 leaves 28B expert parameters per rank: 175 GiB with fp32 gradients, which B200-sized GPUs hold.
    "--gpu-memory-gb", "192",
]  # fmt: skip


def test_slime_minimax_m2_launch_script_starts(
    published: Callable[[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*SLIME_MODEL_FILES["minimax-m2"], "--hf-checkpoint", str(published("minimax-m2")), *SLIME_MINIMAX_M2_RUN]
    _expect_start(argv, "minimax_m2", capsys)
    # Its configuration_minimax_m2.py stores num_local_experts (no attribute_map): 256 experts in all 62 layers.
    with pytest.raises(SystemExit):
        parse_args([*argv, "--dry-run"])
    assert "model: minimax_m2, 228.69B parameters (224.68B in routed experts)" in capsys.readouterr().out
    args = parse_args(argv)
    # Colocated without --rollout-num-gpus: the engines take the trainer's 128 GPUs, as in slime.
    assert args.rollout_num_gpus == args.world_size == 128 and args.sequence_parallel
