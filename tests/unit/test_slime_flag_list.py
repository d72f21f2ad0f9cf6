"""Every flag of slime's slime/utils/arguments.py (at 624b824) is accepted with slime's meaning here, or refused at
start with an error naming it and why; and the meanings given to slime's flags that were unknown before."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from slime_like.arguments import build_parser, parse_args
from slime_like.core.refused import Refused
from slime_like.core.sample import Sample

# The 223 flag names of slime's slime/utils/arguments.py at 624b824 (its own flags; Megatron's pass through too).
SLIME_FLAGS = [
    "--actor-num-gpus-per-node", "--actor-num-nodes", "--advantage-estimator", "--allgather-cp",
    "--apply-chat-template", "--apply-chat-template-kwargs", "--async-save", "--balance-by-flops", "--balance-data",
    "--buffer-filter-path", "--calculate-per-token-loss", "--check-weight-update-equal", "--ci-disable-kl-checker",
    "--ci-load-grad-norm", "--ci-save-grad-norm", "--ci-test", "--ci-train-rollout-logprob-abs-diff-threshold",
    "--clip-grad", "--colocate", "--custom-advantage-function-path", "--custom-config-path",
    "--custom-convert-samples-to-train-data-path", "--custom-eval-rollout-log-function-path",
    "--custom-generate-function-path", "--custom-loss-function-path", "--custom-megatron-before-log-prob-hook-path",
    "--custom-megatron-before-train-step-hook-path", "--custom-megatron-init-path", "--custom-model-provider-path",
    "--custom-pg-loss-reducer-function-path", "--custom-reward-post-process-path", "--custom-rm-path",
    "--custom-rollout-log-function-path", "--custom-tis-function-path", "--custom-update-weight-post-write-path",
    "--data-pad-size-multiplier", "--data-source-path", "--debug-rollout-only", "--debug-train-only",
    "--disable-compute-advantages-and-returns", "--disable-grpo-std-normalization", "--disable-rewards-normalization",
    "--disable-rollout-global-dataset", "--disable-wandb-random-suffix", "--distributed-backend",
    "--distributed-timeout-minutes", "--dump-details", "--dynamic-sampling-filter-path", "--enable-mtp-training",
    "--entropy-coef", "--eps-clip", "--eps-clip-c", "--eps-clip-high", "--eval-config", "--eval-function-path",
    "--eval-input-key", "--eval-interval", "--eval-label-key", "--eval-max-context-len", "--eval-max-prompt-len",
    "--eval-max-response-len", "--eval-min-new-tokens", "--eval-prompt-data", "--eval-reward-key",
    "--eval-temperature", "--eval-tool-key", "--eval-top-k", "--eval-top-p", "--fetch-trajectory-retry-times",
    "--freeze-indexer", "--freeze-params-name-list", "--gamma", "--get-mismatch-metrics", "--global-batch-size",
    "--group-rm", "--hf-checkpoint", "--http-proxy", "--input-key", "--keep-old-actor", "--kl-coef", "--kl-loss-coef",
    "--kl-loss-type", "--label-key", "--lambd", "--load", "--load-debug-rollout-data",
    "--load-debug-rollout-data-subsample", "--load-forge-rollout-data", "--log-correct-samples", "--log-multi-turn",
    "--log-passrate", "--log-probs-chunk-size", "--log-probs-max-tokens-per-gpu", "--log-reward-category",
    "--loss-mask-type", "--loss-type", "--lr", "--mask-offpolicy-in-partial-rollout", "--max-tokens-per-gpu",
    "--megatron-config-path", "--megatron-deepgemm-forward-layers", "--megatron-deepgemm-forward-modules",
    "--megatron-deepgemm-moe-forward-layers", "--megatron-deepgemm-moe-forward-modules", "--memory-recorder",
    "--memory-snapshot-dir", "--memory-snapshot-num-steps", "--metadata-key", "--micro-batch-size",
    "--min-batch-collection-ratio", "--model-name", "--mtp-loss-scaling-factor", "--mtp-num-layers",
    "--multimodal-keys", "--n-samples-per-eval-prompt", "--n-samples-per-prompt", "--no-save-optim",
    "--normalize-advantages", "--num-critic-only-steps", "--num-epoch", "--num-gpus-per-node", "--num-rollout",
    "--num-steps-per-rollout", "--offload", "--offload-rollout", "--offload-train", "--only-train-params-name-list",
    "--opd-kl-coef", "--opd-teacher-ckpt-step", "--opd-teacher-load", "--opd-type", "--opsm-delta",
    "--over-sampling-batch-size", "--padded-vocab-size", "--partial-rollout", "--profile-target", "--prompt-data",
    "--qwen-gdn-backend", "--recompute-loss-function", "--record-memory-history", "--ref-ckpt-step", "--ref-load",
    "--ref-update-interval", "--release-train", "--reset-optimizer-states", "--reward-key", "--rm-type", "--rm-url",
    "--rollout-all-samples-process-path", "--rollout-batch-size", "--rollout-buffer-url",
    "--rollout-data-postprocess-path", "--rollout-data-transport", "--rollout-external-engine-addrs",
    "--rollout-function-path", "--rollout-health-check-first-wait", "--rollout-health-check-interval",
    "--rollout-health-check-timeout", "--rollout-max-context-len", "--rollout-max-prompt-len",
    "--rollout-max-response-len", "--rollout-num-gpus", "--rollout-num-gpus-per-engine",
    "--rollout-sample-filter-path", "--rollout-sample-hook-path", "--rollout-seed", "--rollout-shuffle",
    "--rollout-skip-special-tokens", "--rollout-stop", "--rollout-stop-token-ids", "--rollout-task-type",
    "--rollout-temperature", "--rollout-top-k", "--rollout-top-p", "--save", "--save-debug-rollout-data",
    "--save-debug-train-data", "--save-hf", "--save-interval", "--seed", "--skip-eval-before-train",
    "--start-rollout-id", "--tb-experiment-name", "--tb-project-name", "--tis-clip", "--tis-clip-low", "--tool-key",
    "--train-backend", "--train-env-vars", "--update-weight-buffer-size", "--update-weight-delta-checksum",
    "--update-weight-delta-encoding", "--update-weight-disk-dir", "--update-weight-disk-keep-files",
    "--update-weight-local-checkpoint-dir", "--update-weight-mode", "--update-weight-transport",
    "--update-weights-interval", "--use-distributed-post", "--use-dynamic-batch-size", "--use-fault-tolerance",
    "--use-kl-loss", "--use-opd", "--use-opsm", "--use-rollout-entropy", "--use-rollout-logprobs",
    "--use-rollout-routing-replay", "--use-routing-replay", "--use-stateless-adam", "--use-tensorboard", "--use-tis",
    "--use-unbiased-kl", "--use-wandb", "--value-clip", "--wandb-always-use-train-step", "--wandb-dir",
    "--wandb-group", "--wandb-host", "--wandb-key", "--wandb-mode", "--wandb-project", "--wandb-run-id",
    "--wandb-team",]  # fmt: skip


def test_the_list_is_slimes() -> None:
    assert len(SLIME_FLAGS) == len(set(SLIME_FLAGS)) == 223


def test_every_slime_flag_is_accepted_or_refused_naming_it(base: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    actions = build_parser()._option_string_actions
    unknown = [flag for flag in SLIME_FLAGS if flag not in actions]
    assert not unknown, f"slime flags neither accepted nor refused: {unknown}"
    refused = [flag for flag in SLIME_FLAGS if isinstance(actions[flag], Refused)]
    for flag in refused:
        with pytest.raises(SystemExit):
            parse_args(base + [flag, "1"])
        err = capsys.readouterr().err
        assert f"{flag} is not supported here: " in err and "unrecognized" not in err, err
    assert "--multimodal-keys" not in refused and "--megatron-deepgemm-forward-layers" in refused


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--rollout-data-transport", "nixl"], "--rollout-data-transport nixl is not supported here"),
        (["--rollout-buffer-url", "http://b"], "--rollout-buffer-url is a setting of slime's rollout-buffer"),
        (["--padded-vocab-size", "7"], "padded"),
        (["--apply-chat-template-kwargs", "[1]"], "expected a JSON object"),
        (["--apply-chat-template-kwargs", '{"enable_thinking": false}'], "add --apply-chat-template"),
        (["--ref-update-interval", "2"], "--ref-update-interval refreshes the KL reference"),
        (["--freeze-params-name-list", "("], "--freeze-params-name-list '(': not a regular expression"),
        (["--save-hf", "/h/{rollout_id}"], "--save-hf writes an HF checkpoint at each save: it needs --save"),
        (["--ref-ckpt-step", "3"], "--ref-ckpt-step picks a checkpoint of --ref-load"),
        (
            ["--update-weight-disk-keep-files", "--update-weight-fallback", "none"],
            "it needs --update-weight-transport disk",
        ),
        (["--update-weights-interval", "0"], "--update-weights-interval 0 must be >= 1"),
        (["--train-env-vars", "x"], "not JSON"),
    ],
)
def test_slime_flag_values_are_checked(
    base: list[str], capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    with pytest.raises(SystemExit):
        parse_args(base + extra)
    assert message in capsys.readouterr().err


def test_parsed_meanings(base: list[str], tmp_path: Path) -> None:
    args = parse_args(base + ["--colocate", "--offload", "--dump-details", str(tmp_path / "d"), "--no-save-optim",
                              "--load", str(tmp_path / "none"), "--train-env-vars", '{"A": 1}', "--start-rollout-id",
                              "2", "--skip-eval-before-train", "--update-weights-interval", "3",
                              "--eval-min-new-tokens", "4", "--rollout-skip-special-tokens"])  # fmt: skip
    assert args.offload_train is True and args.offload_rollout is True
    assert args.save_debug_rollout_data == f"{tmp_path}/d/rollout_data/{{rollout_id}}.pt"
    assert args.save_debug_train_data == f"{tmp_path}/d/train_data/{{rollout_id}}.pt"
    assert args.no_load_optim is True  # as slime: what saves no optimizer loads none
    assert args.train_env_vars == {"A": "1"} and args.start_rollout_id == 2

    from rollout.evaluation import eval_sampling_params
    from rollout.generate import sampling_params_from_args

    assert sampling_params_from_args(args)["skip_special_tokens"] is True
    assert eval_sampling_params(args)["min_new_tokens"] == 4
    assert sampling_params_from_args(parse_args(base))["skip_special_tokens"] is False


def test_no_effect_flags_are_named_at_start(base: list[str]) -> None:
    from slime_like.trainer.megatron.flags import no_effect_line

    args = parse_args(base + ["--async-save", "--http-proxy", "http://p", "--qwen-gdn-backend", "fla"])
    line = no_effect_line(args, transformer_engine=False, cuda=False)
    assert line is not None and {"--async-save", "--http-proxy", "--qwen-gdn-backend"} <= set(line.split()[4:])


def test_chat_template_kwargs_reach_the_template(tmp_path: Path) -> None:
    from buffer.data_source import PromptDataset

    seen = []

    class Tokenizer:
        def apply_chat_template(self, messages: list, **kwargs: object) -> str:
            seen.append(kwargs)
            return "templated"

        def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
            return {"input_ids": [1, 2]}

    rows = tmp_path / "p.jsonl"
    rows.write_text('{"input": "1+1="}\n')
    kwargs = {"input_key": "input", "label_key": None, "tokenizer": Tokenizer(), "apply_chat_template": True}
    PromptDataset(rows, chat_template_kwargs={"enable_thinking": False}, **kwargs)
    assert seen[0]["enable_thinking"] is False and seen[0]["add_generation_prompt"] is True


def test_passrate_and_reward_category_metrics() -> None:
    from rollout.metrics import rollout_metrics

    def sample(ok: bool) -> Sample:
        return Sample(reward={"score": float(ok), "why": "ok" if ok else "format"}, response_length=1)

    groups = [[sample(True), sample(False)], [sample(False), sample(False)]]
    args = SimpleNamespace(log_passrate=True, log_reward_category="why", reward_key="score", eval_pass_threshold=1.0)
    metrics = rollout_metrics(groups, "score", args=args)
    assert metrics["rollout/pass@1"] == 0.25 and metrics["rollout/pass@2"] == 0.5
    assert metrics["error_cat/ok"] == 0.25 and metrics["error_cat/format"] == 0.75
    assert "rollout/pass@1" not in rollout_metrics(groups, "score")


def test_eval_reward_key_falls_back_to_the_reward_key() -> None:
    from rollout.slime_arguments import eval_reward_key

    assert eval_reward_key(SimpleNamespace(eval_reward_key=None, reward_key="acc")) == "acc"
    assert eval_reward_key(SimpleNamespace(eval_reward_key="pass", reward_key="acc")) == "pass"


def test_freeze_flags_follow_slimes_rules() -> None:
    from slime_like.trainer.train_options import freeze_callback, is_indexer_parameter, trainable_filter

    assert trainable_filter(SimpleNamespace()) is None
    only = trainable_filter(SimpleNamespace(only_train_params_name_list=[r"layers\.1\."],
                                            freeze_params_name_list=["bias"]))  # fmt: skip
    assert only("decoder.layers.1.mlp.weight") and not only("decoder.layers.1.mlp.bias")
    assert not only("decoder.layers.0.mlp.weight")
    assert is_indexer_parameter("decoder.layers.0.self_attention.core_attention.indexer.linear_wq_b.weight")
    assert not is_indexer_parameter("decoder.layers.0.self_attention.linear_qkv.weight")
    model = torch.nn.Module()
    model.embedding = torch.nn.Linear(2, 2)
    model.output_layer = torch.nn.Linear(2, 2)
    trains = trainable_filter(SimpleNamespace(freeze_params_name_list=["embedding"]))
    freeze_callback(trains)(model, True, True, None, None)
    assert [p.requires_grad for p in model.parameters()] == [False, False, True, True]


def test_reset_optimizer_states_clears_adams_moments() -> None:
    from slime_like.trainer.train_options import reset_optimizer_states

    param = torch.nn.Parameter(torch.ones(3))
    adam = torch.optim.Adam([param])
    param.grad = torch.ones(3)
    adam.step()
    reset_optimizer_states(SimpleNamespace(chained_optimizers=[SimpleNamespace(optimizer=adam)]))
    state = adam.state[param]
    assert float(state["step"]) == 0 and not state["exp_avg"].any() and not state["exp_avg_sq"].any()


def test_logger_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slime_like.metrics_log import tensorboard_dir, wandb_init_kwargs

    monkeypatch.setenv("TENSORBOARD_DIR", "")
    monkeypatch.setenv("WANDB_MODE", "online")  # restored after the test (the flag sets it)
    args = SimpleNamespace(tb_project_name="p", tb_experiment_name="e")
    assert tensorboard_dir(args, tmp_path) == "tensorboard_log/p/e"
    assert tensorboard_dir(SimpleNamespace(), tmp_path) == str(tmp_path / "tensorboard")
    calls = []
    wandb = SimpleNamespace(login=lambda **kw: calls.append(kw))
    args = argparse.Namespace(wandb_mode="offline", wandb_key="k", wandb_dir=str(tmp_path / "w"), wandb_run_id="r1")
    kwargs = wandb_init_kwargs(args, wandb)
    assert calls == [] and kwargs["dir"] == str(tmp_path / "w") and (kwargs["id"], kwargs["resume"]) == ("r1", "allow")
    import os

    assert os.environ["WANDB_MODE"] == "offline"


def test_train_env_vars_reach_the_trainer_ranks() -> None:
    from slime_like.actor_group import trainer_env

    options = {"num_cpus": 1, "runtime_env": {"env_vars": {"OMP_NUM_THREADS": "1"}}}
    out = trainer_env(options, SimpleNamespace(train_env_vars={"A": "1"}))
    assert out["runtime_env"]["env_vars"] == {"OMP_NUM_THREADS": "1", "A": "1"} and out["num_cpus"] == 1
    assert trainer_env(options, SimpleNamespace(train_env_vars={})) is options


def test_loop_flags() -> None:
    from slime_like.run import Run

    run = SimpleNamespace(args=SimpleNamespace(update_weights_interval=3))
    assert [Run.weights_due(run, r) for r in range(6)] == [False, False, True, False, False, True]
    args = SimpleNamespace(debug_train_only=False, eval_interval=5, skip_eval_before_train=True)
    assert Run.evaluate(SimpleNamespace(args=args), 0) == {}
