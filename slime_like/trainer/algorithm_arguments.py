"""Flags of the RL algorithm: advantage estimator, policy loss, off-policy corrections, OPD, routing replay, critic."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from slime_like.core.hf_config import hf_field
from slime_like.trainer.hooks import add_trainer_hook_arguments, load_trainer_hooks


def add_algorithm_arguments(parser: argparse.ArgumentParser) -> None:
    """Advantage estimator, policy-loss, off-policy, DAPO, SFT, critic and custom-hook flags."""
    from slime_like.trainer.algorithms.names import AGG_MODES, ESTIMATORS, KL_TYPES, LOSS_TYPES, MIS_LEVELS

    add_trainer_hook_arguments(parser)
    g = parser.add_argument_group("algorithm")
    g.add_argument("--advantage-estimator", default="grpo", choices=ESTIMATORS)
    g.add_argument("--disable-grpo-std-normalization", action="store_true", help="Dr.GRPO: centre rewards only")
    g.add_argument(
        "--disable-rewards-normalization",
        action="store_false",
        dest="rewards_normalization",
        help="grpo/gspo/cispo take the raw reward as the advantage and reinforce_plus_plus_baseline drops its group "
        "baseline (slime's switch of its group normalisation)",
    )
    g.add_argument("--normalize-advantages", action="store_true", help="whiten advantages over the rollout's tokens")
    g.add_argument("--loss-type", default="policy_loss", choices=LOSS_TYPES)
    g.add_argument(
        "--disable-compute-advantages-and-returns",
        action="store_true",
        help="slime's SFT flag: no old-policy log-probs, advantages or returns before the step; only with "
        "--loss-type sft_loss, which computes none of them anyway",
    )
    g.add_argument(
        "--loss-agg-mode",
        default=None,
        choices=AGG_MODES,
        help="how token losses make a step's loss; default seq-mean-token-mean (each sample's token mean, "
        "averaged over samples, as slime), token-mean with --calculate-per-token-loss; seq-mean-token-sum-norm is "
        "Dr.GRPO's constant normaliser --rollout-max-response-len",
    )
    g.add_argument(
        "--calculate-per-token-loss",
        action="store_true",
        help="Megatron-LM's flag as slime reads it: every token of the step weighs the same (--loss-agg-mode "
        "token-mean)",
    )
    g.add_argument("--eps-clip", type=float, default=0.2)
    g.add_argument(
        "--eps-clip-high", type=float, default=None, help="upper clip (DAPO clip-higher); default --eps-clip"
    )
    g.add_argument("--eps-clip-c", type=float, default=None, help="dual-clip bound c > 1 for negative advantages")
    g.add_argument("--entropy-coef", type=float, default=0.0, help="entropy bonus")
    g.add_argument("--use-kl-loss", action="store_true", help="add a KL-to-reference term to the loss")
    g.add_argument("--kl-loss-coef", type=float, default=0.0)
    g.add_argument("--kl-loss-type", default="k1", choices=KL_TYPES, help="KL estimator (default k1, as slime)")
    g.add_argument(
        "--use-unbiased-kl",
        action="store_true",
        help="weigh the KL loss per token by pi/pi_old (DeepSeek-V3.2's unbiased estimate), as slime",
    )
    g.add_argument(
        "--kl-coef",
        type=float,
        default=0.0,
        help="KL-to-reference penalty in the token rewards (ppo, reinforce_plus_plus[_baseline])",
    )
    g.add_argument("--gamma", type=float, default=1.0, help="discount of token returns (ppo, reinforce++)")
    g.add_argument("--lambd", type=float, default=1.0, help="GAE lambda (ppo)")
    g.add_argument(
        "--custom-advantage-function-path",
        default=None,
        help="(args, AdvantageInputs) -> per-sample advantage tensors; see slime_like/trainer/algorithms/advantages.py",
    )
    g.add_argument(
        "--custom-pg-loss-reducer-function-path",
        default=None,
        help="slime's contract: fn(total_lengths, response_lengths, loss_masks, calculate_per_token_loss) -> "
        "reducer of the policy-gradient loss; see slime_like/trainer/algorithms/slime_contract.py",
    )
    g.add_argument(
        "--custom-loss-function-path",
        default=None,
        help="with --loss-type custom_loss: (args, log_probs, entropy, rows) -> per-token losses; "
        "see slime_like/trainer/algorithms/loss.py",
    )
    d = parser.add_argument_group("DAPO overlong shaping")
    d.add_argument(
        "--overlong-buffer-len", type=int, default=0, help="soft overlong penalty over the last N tokens (0: off)"
    )
    d.add_argument("--overlong-penalty-factor", type=float, default=1.0)
    o = parser.add_argument_group("off-policy corrections")
    o.add_argument(
        "--use-rollout-logprobs", action="store_true", help="SGLang's log-probs as the old policy of the ratio"
    )
    o.add_argument("--use-tis", action="store_true", help="truncated importance sampling on rollout log-probs")
    o.add_argument("--tis-clip", type=float, default=2.0, help="upper bound of the TIS weight")
    o.add_argument("--tis-clip-low", type=float, default=0.0, help="lower bound of the TIS weight")
    o.add_argument(
        "--custom-tis-function-path",
        default=None,
        help="with --use-tis: slime's contract, fn(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, "
        "total_lengths, response_lengths) -> (pg_loss, loss_masks, metrics); see slime_like/trainer/algorithms/slime_contract.py",
    )
    o.add_argument(
        "--get-mismatch-metrics",
        action="store_true",
        help="as slime: turns on the TIS path (--use-tis: the clipped weight multiplies the loss) and its metrics; "
        "the train/rollout mismatch itself is logged in every run that has SGLang's log-probs",
    )
    o.add_argument(
        "--use-opsm",
        action="store_true",
        help="off-policy sequence masking: drop a negative-advantage sequence whose mean log(pi_old/pi) > --opsm-delta",
    )
    o.add_argument("--opsm-delta", type=float, default=1e-4, help="threshold of --use-opsm")
    o.add_argument("--use-mis", action="store_true", help="masked importance sampling: drop what leaves the band")
    o.add_argument("--mis-level", default="token", choices=MIS_LEVELS)
    o.add_argument("--mis-low", type=float, default=0.5, help="band of the IS ratio (also of the mismatch metric)")
    o.add_argument("--mis-high", type=float, default=2.0)
    o.add_argument("--use-decoupled-loss", action="store_true", help="AReaL's decoupled PPO objective")
    o.add_argument("--behav-imp-weight-cap", type=float, default=None, help="drop tokens whose weight exceeds it")
    n = parser.add_argument_group("not supported here (each is an error naming why)")
    d = parser.add_argument_group("on-policy distillation (slime's flags; slime_like/trainer/algorithms/opd.py)")
    d.add_argument(
        "--use-opd",
        action="store_true",
        help="each token's advantage minus --opd-kl-coef x (log pi_old - log pi_teacher), on any estimator",
    )
    d.add_argument(
        "--opd-type",
        default=None,
        choices=["sglang", "megatron"],
        help="sglang: a teacher SGLang server at --rm-url scores the samples (slime.rollout.on_policy_distillation); "
        "megatron: a frozen teacher of the policy's architecture in the trainer, from --opd-teacher-load",
    )
    d.add_argument("--opd-kl-coef", type=float, default=1.0, help="weight of the teacher's reverse KL (slime: 1.0)")
    d.add_argument(
        "--opd-teacher-load",
        default=None,
        help="--opd-type megatron: the teacher's Megatron checkpoint (torch_dist, e.g. from "
        "tools/convert_hf_to_torch_dist.py), the policy's architecture",
    )
    d.add_argument(
        "--opd-teacher-ckpt-step",
        type=int,
        default=None,
        help="load the teacher from --opd-teacher-load's iter_<step> instead of its latest checkpoint",
    )
    n.add_argument("--megatron-config-path", default=None, help="slime's per-role Megatron YAML: not supported")
    n.add_argument("--custom-model-provider-path", default=None, help="slime's model provider hook: not supported")
    g.add_argument(
        "--custom-config-path",
        default=None,
        help="YAML of argument values set on args, as slime: existing names override the command line, new ones "
        "are there for plugins to read",
    )
    r = parser.add_argument_group("MoE routing replay (slime's flags; docs/migrating-from-slime.md)")
    r.add_argument(
        "--use-routing-replay",
        action="store_true",
        help="record the experts each MoE router picks in the old-policy log-prob forward and replay them in the "
        "training forwards (arXiv:2507.18071)",
    )
    r.add_argument(
        "--use-rollout-routing-replay",
        action="store_true",
        help="R3: SGLang returns every token's routed experts and the trainer replays them in its log-prob and "
        "training forwards (arXiv:2510.11370); implies --use-routing-replay",
    )
    c = parser.add_argument_group("critic (--advantage-estimator ppo)")
    c.add_argument("--critic-lr", type=float, default=None, help="default --lr")
    c.add_argument("--value-clip", type=float, default=0.2, help="value clipping around the rollout's values")
    c.add_argument(
        "--num-critic-only-steps", type=int, default=0, help="first N rollouts train only the critic (warm-up)"
    )


def validate_algorithm_args(args: argparse.Namespace) -> None:
    """Fill the algorithm group's derived defaults and reject contradictions, naming the flags."""
    from slime_like.trainer.algorithms.names import SEQUENCE_LEVEL

    est = args.advantage_estimator
    _reject_unsupported(args)
    if args.get_mismatch_metrics:
        # slime runs its TIS path for either flag (loss.py: `if args.get_mismatch_metrics or args.use_tis`), so the
        # clipped weight multiplies the loss here too; the mismatch metrics themselves are always logged.
        others = [f for f in ("use_mis", "use_decoupled_loss", "use_rollout_logprobs") if getattr(args, f)]
        if others:
            _error(
                f"--get-mismatch-metrics applies slime's TIS weights (as --use-tis), which --{others[0].replace('_', '-')} "
                "excludes: drop one of them (the mismatch metrics are logged anyway)"
            )
        args.use_tis = True
    if args.custom_tis_function_path and not args.use_tis:
        _error("--custom-tis-function-path replaces the TIS weights: it needs --use-tis (or --get-mismatch-metrics)")
    if args.use_unbiased_kl and not args.use_kl_loss:
        _error("--use-unbiased-kl weighs the KL loss: it needs --use-kl-loss")
    if args.custom_pg_loss_reducer_function_path:
        if args.loss_type != "policy_loss":
            _error("--custom-pg-loss-reducer-function-path reduces the policy loss: it needs --loss-type policy_loss")
        if args.loss_agg_mode not in (None, "seq-mean-token-mean", "token-mean"):
            _error(
                "--custom-pg-loss-reducer-function-path replaces slime's reducer, which is --loss-agg-mode "
                f"seq-mean-token-mean (or token-mean with --calculate-per-token-loss), not {args.loss_agg_mode}"
            )
    if args.eps_clip_high is None:
        args.eps_clip_high = args.eps_clip
    if args.loss_agg_mode is None:
        args.loss_agg_mode = "token-mean" if args.calculate_per_token_loss else "seq-mean-token-mean"
    elif args.calculate_per_token_loss and args.loss_agg_mode != "token-mean":
        _error(f"--calculate-per-token-loss means --loss-agg-mode token-mean, not {args.loss_agg_mode}")
    if args.eps_clip_c is not None and args.eps_clip_c <= 1.0:
        _error(f"--eps-clip-c {args.eps_clip_c}: the dual-clip bound must be > 1")
    if args.eps_clip_c is not None and est == "cispo":
        _error("--eps-clip-c (dual-clip) has no effect with --advantage-estimator cispo, which clips the weight")
    if args.gamma != 1.0 and est not in ("ppo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"):
        _error(f"--gamma discounts token returns, which --advantage-estimator {est} does not use")
    if args.lambd != 1.0 and est != "ppo":
        _error("--lambd is GAE's lambda: it needs --advantage-estimator ppo")
    if args.kl_loss_coef and not args.use_kl_loss:
        _error("--kl-loss-coef is set but --use-kl-loss is not: add --use-kl-loss (or drop the coefficient)")
    if args.kl_coef and est in SEQUENCE_LEVEL:
        _error(
            f"--kl-coef shapes token rewards, which --advantage-estimator {est} does not use: "
            "use --use-kl-loss --kl-loss-coef, or ppo / reinforce_plus_plus[_baseline]"
        )
    if (args.loss_type == "custom_loss") != bool(args.custom_loss_function_path):
        _error("--loss-type custom_loss and --custom-loss-function-path go together")
    if est == "rloo" and args.n_samples_per_prompt < 2:
        _error("--advantage-estimator rloo needs --n-samples-per-prompt >= 2 (the leave-one-out baseline)")
    if est != "ppo" and (args.num_critic_only_steps or args.critic_lr is not None):
        _error("--num-critic-only-steps and --critic-lr need --advantage-estimator ppo (the critic)")
    corrections = [f for f in ("use_tis", "use_mis", "use_decoupled_loss") if getattr(args, f)]
    if len(corrections) > 1:
        _error(f"choose one off-policy correction, not {' and '.join('--' + f.replace('_', '-') for f in corrections)}")
    if corrections and args.use_rollout_logprobs:
        _error(
            f"--{corrections[0].replace('_', '-')} weights pi_old/pi_rollout; with --use-rollout-logprobs "
            "pi_old is pi_rollout and the weight is 1: drop one of them"
        )
    if args.use_tis and not 0 <= args.tis_clip_low < args.tis_clip:
        _error(f"--tis-clip-low {args.tis_clip_low} must be >= 0 and below --tis-clip {args.tis_clip}")
    if not 0 <= args.mis_low < args.mis_high:
        _error(f"--mis-low {args.mis_low} must be >= 0 and below --mis-high {args.mis_high}")
    if args.behav_imp_weight_cap is not None and not args.use_decoupled_loss:
        _error("--behav-imp-weight-cap needs --use-decoupled-loss")
    if args.overlong_buffer_len and not 0 < args.overlong_buffer_len < args.rollout_max_response_len:
        _error(
            f"--overlong-buffer-len {args.overlong_buffer_len} must be between 0 and "
            f"--rollout-max-response-len {args.rollout_max_response_len}"
        )
    if args.loss_type == "sft_loss":
        rl_only = [
            flag
            for flag, on in (
                ("--use-kl-loss", args.use_kl_loss),
                ("--kl-coef", args.kl_coef),
                ("--advantage-estimator ppo", est == "ppo"),
                ("--entropy-coef", args.entropy_coef),
                ("--overlong-buffer-len", args.overlong_buffer_len),
                ("--use-rollout-logprobs", args.use_rollout_logprobs),
                *((f"--{f.replace('_', '-')}", True) for f in corrections),
            )
            if on
        ]
        if rl_only:
            _error(f"--loss-type sft_loss trains on the data's tokens; {', '.join(rl_only)} would be ignored")
    elif args.disable_compute_advantages_and_returns:
        _error(
            f"--disable-compute-advantages-and-returns: --loss-type {args.loss_type} needs the advantages (and the "
            "old policy's log-probs); the flag is for SFT, with --loss-type sft_loss"
        )
    _check_hooks(args)


def apply_routing_replay(args: argparse.Namespace, config: Any) -> None:
    """--use-(rollout-)routing-replay: check the model is MoE, fill the layout of SGLang's routed experts
    (--num-layers, --moe-router-topk) and, for R3, start every SGLang engine with --enable-return-routed-experts."""
    if args.use_rollout_routing_replay:
        args.use_routing_replay = True  # as slime: R3 is routing replay with the rollout's routing
    if not args.use_routing_replay:
        return
    flag = "--use-rollout-routing-replay" if args.use_rollout_routing_replay else "--use-routing-replay"
    experts, topk = hf_field(config, "num_experts"), hf_field(config, "num_experts_per_tok")
    if not experts or not topk:
        _error(
            f"{flag} replays the experts of MoE routers, but --hf-checkpoint is a dense model "
            f"({getattr(config, 'model_type', '?')}: no num_experts / num_experts_per_tok in its config)"
        )
    if args.loss_type == "sft_loss":
        _error(f"{flag} replays routing in RL training; --loss-type sft_loss has no rollout or old-policy forward")
    # The rows of SGLang's routed experts are [layers, topk] (slime reads the same two flags).
    args.num_layers = args.num_layers or hf_field(config, "num_hidden_layers")
    args.moe_router_topk = args.moe_router_topk or topk
    if args.use_rollout_routing_replay:
        from rollout.sglang_server import ROUTED_EXPERTS_FLAG

        given = list(getattr(args, "sglang_server_args", None) or [])
        args.sglang_server_args = given + ([] if ROUTED_EXPERTS_FLAG in given else [ROUTED_EXPERTS_FLAG])


def _check_opd(args: argparse.Namespace) -> None:
    """slime's rules for --use-opd: a type; a teacher checkpoint only with (and for) megatron."""
    if args.opd_teacher_ckpt_step is not None and args.opd_teacher_load is None:
        _error("--opd-teacher-ckpt-step picks a checkpoint of --opd-teacher-load: add --opd-type megatron and it")
    if not args.use_opd:
        if args.opd_teacher_load is not None:
            _error("--opd-teacher-load is set but --use-opd is not: add --use-opd --opd-type megatron")
        return
    if args.opd_type is None:
        _error("--use-opd needs --opd-type: sglang (a teacher server at --rm-url) or megatron")
    if args.opd_type == "megatron":
        if args.opd_teacher_load is None:
            _error(
                "--opd-type megatron needs --opd-teacher-load: the teacher's Megatron checkpoint, of the policy's "
                "architecture (make one from HF weights with tools/convert_hf_to_torch_dist.py); a teacher of "
                "another architecture is served with --opd-type sglang"
            )
        if not Path(args.opd_teacher_load).exists():
            _error(f"--opd-teacher-load {args.opd_teacher_load}: no such directory")
        if args.opd_teacher_ckpt_step is not None:
            from slime_like.trainer.megatron.checkpoint_layout import CheckpointError, require_checkpoint

            try:
                require_checkpoint(args.opd_teacher_load, "--opd-teacher-load", args.opd_teacher_ckpt_step)
            except CheckpointError as exc:
                _error(str(exc))
        return
    if args.opd_teacher_load is not None:
        _error("--opd-teacher-load is for --opd-type megatron; with sglang the teacher is the server at --rm-url")


def _reject_unsupported(args: argparse.Namespace) -> None:
    """slime's flags for features this engine does not have: an error naming the flag and why."""
    _check_opd(args)
    if args.custom_model_provider_path:
        _error(
            "--custom-model-provider-path is not supported: the model is built from the HF config by the family "
            "registry (slime_like/trainer/megatron/families.py, bridges.py), and its weights are loaded and exported by "
            "name through it; a new architecture is added there (docs/models.md), not by a provider function"
        )
    if args.megatron_config_path:
        _error(
            "--megatron-config-path (slime's per-role Megatron YAML) is not supported: the critic shares the "
            "actor's flags here, with its own --critic-lr"
        )


def _check_hooks(args: argparse.Namespace) -> None:
    """Import the custom loss/advantage functions now, before any server starts."""
    from slime_like.core.errors import PluginError
    from slime_like.core.plugin_loader import load_plugin

    try:
        if args.custom_tis_function_path:
            load_plugin(args.custom_tis_function_path, "--custom-tis-function-path", is_async=False)
        if args.custom_pg_loss_reducer_function_path:
            path = args.custom_pg_loss_reducer_function_path
            load_plugin(path, "--custom-pg-loss-reducer-function-path", params=4, is_async=False)
        if args.custom_loss_function_path:
            load_plugin(args.custom_loss_function_path, "--custom-loss-function-path", params=4, is_async=False)
        if args.custom_advantage_function_path:
            load_plugin(
                args.custom_advantage_function_path, "--custom-advantage-function-path", params=2, is_async=False
            )
        load_trainer_hooks(args)
    except PluginError as exc:
        _error(str(exc))


def _error(message: str) -> None:
    from slime_like.core.errors import ArgumentError

    raise ArgumentError(message)
