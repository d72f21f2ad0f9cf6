"""The algorithm flags: derived defaults, and contradictions rejected with the flags named."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from slime_like.arguments import parse_args


@pytest.fixture
def base(base: list[str]) -> list[str]:
    """The required flags (conftest) with a short response length."""
    return base + ["--rollout-max-response-len", "64"]


def test_defaults(base: list[str]) -> None:
    args = parse_args(base)
    # slime's defaults: each sample's token mean, averaged over samples; k1 KL.
    assert args.loss_agg_mode == "seq-mean-token-mean" and args.eps_clip_high == 0.2 and args.loss_type == "policy_loss"
    assert args.kl_loss_type == "k1"
    # Megatron-LM's --calculate-per-token-loss, as slime reads it: every token weighs the same.
    assert parse_args(base + ["--calculate-per-token-loss"]).loss_agg_mode == "token-mean"
    # What most slime scripts pass: the reference is loaded and the KL logged, nothing added to the loss.
    kl0 = parse_args(base + ["--use-kl-loss", "--kl-loss-coef", "0"])
    assert kl0.use_kl_loss and kl0.kl_loss_coef == 0.0
    ok = parse_args(base + ["--advantage-estimator", "ppo", "--kl-coef", "0.1", "--critic-lr", "1e-5"])
    assert ok.kl_coef == 0.1 and ok.critic_lr == 1e-5


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--calculate-per-token-loss", "--loss-agg-mode", "seq-mean-token-sum"], "means --loss-agg-mode token-mean"),
        (["--kl-loss-coef", "0.1"], "--kl-loss-coef is set but --use-kl-loss is not"),
        (["--kl-coef", "0.1"], "--kl-coef shapes token rewards, which --advantage-estimator grpo"),
        (["--eps-clip-c", "0.9"], "--eps-clip-c 0.9: the dual-clip bound must be > 1"),
        (["--advantage-estimator", "cispo", "--eps-clip-c", "3"], "--eps-clip-c (dual-clip) has no effect"),
        (["--gamma", "0.9"], "--gamma discounts token returns, which --advantage-estimator grpo does not use"),
        (["--advantage-estimator", "reinforce_plus_plus", "--lambd", "0.9"], "--lambd is GAE's lambda"),
        (["--loss-type", "custom_loss"], "--loss-type custom_loss and --custom-loss-function-path"),
        (["--custom-loss-function-path", "math.fsum"], "--loss-type custom_loss and --custom-loss-function-path"),
        (["--use-tis", "--use-mis"], "choose one off-policy correction, not --use-tis and --use-mis"),
        (["--use-tis", "--use-rollout-logprobs"], "--use-tis weights pi_old/pi_rollout"),
        (["--use-tis", "--tis-clip", "0.5", "--tis-clip-low", "1"], "--tis-clip-low 1.0 must be >= 0 and below"),
        (["--behav-imp-weight-cap", "2"], "--behav-imp-weight-cap needs --use-decoupled-loss"),
        (["--num-critic-only-steps", "2"], "--num-critic-only-steps and --critic-lr need --advantage-estimator ppo"),
        (["--overlong-buffer-len", "64"], "--overlong-buffer-len 64 must be between 0 and --rollout-max-response-len"),
        (["--loss-type", "sft_loss", "--entropy-coef", "0.1"], "--entropy-coef would be ignored"),
        (
            ["--custom-advantage-function-path", "nosuchmodule.fn"],
            "--custom-advantage-function-path='nosuchmodule.fn': cannot import module",
        ),
        (
            ["--custom-advantage-function-path", "math.fsum"],
            "--custom-advantage-function-path='math.fsum': must accept 2 positional argument(s)",
        ),
    ],
)
def test_contradictions_name_the_flags(
    base: list[str], capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    with pytest.raises(SystemExit):
        parse_args(base + flags)
    assert message in capsys.readouterr().err


def test_rloo_needs_groups(base: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*base, "--advantage-estimator", "rloo"]
    argv[argv.index("--n-samples-per-prompt") + 1] = "1"
    argv[argv.index("--rollout-batch-size") + 1] = "8"
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert "rloo needs --n-samples-per-prompt >= 2" in capsys.readouterr().err


def test_custom_hooks_load_at_parse_time(base: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_algo.py").write_text(
        "def adv(args, inputs):\n    return []\n\ndef loss(args, log_probs, entropy, rows):\n    return []\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    args = parse_args(
        base
        + ["--custom-advantage-function-path", "my_algo.adv", "--loss-type", "custom_loss"]
        + ["--custom-loss-function-path", "my_algo.loss"]
    )
    assert args.loss_type == "custom_loss"
    sys.modules.pop("my_algo", None)
