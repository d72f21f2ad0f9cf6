"""Metrics of a run: appended to metrics.jsonl, printed as one line, optionally to tensorboard/wandb, plotted."""

from __future__ import annotations

import datetime
import json
import logging
import os
import secrets
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

SUMMARY_KEYS = (
    ("rollout/reward_mean", "reward"),
    ("eval/reward_mean", "eval"),
    ("rollout/response_len_mean", "len"),
    ("train/loss", "loss"),
    ("train/grad_norm", "gnorm"),
    ("train/train_rollout_logprob_abs_diff", "mismatch"),
    ("time/step", "step_s"),
)


class MetricsLogger:
    """One record per rollout step, to every sink that is enabled."""

    def __init__(
        self, output_dir: str | Path, args: Any = None, use_tensorboard: bool = False, use_wandb: bool = False
    ) -> None:
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        self.tb = self.wandb = None
        if use_tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(tensorboard_dir(args, self.dir))
            except ImportError as exc:
                raise RuntimeError("--use-tensorboard needs the tensorboard package: pip install tensorboard") from exc
        if use_wandb:
            try:
                import wandb
            except ImportError as exc:
                raise RuntimeError("--use-wandb needs the wandb package: pip install wandb") from exc
            self.wandb = wandb.init(**wandb_init_kwargs(args, wandb))
        # --wandb-always-use-train-step: wandb's step counts optimizer steps (rollout x steps per rollout).
        self.wandb_step_scale = 1
        if args is not None and getattr(args, "wandb_always_use_train_step", False):
            samples = args.rollout_batch_size * args.n_samples_per_prompt
            self.wandb_step_scale = max(1, samples // (args.global_batch_size or samples))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Append one record and print the summary line."""
        record = {"step": step, **metrics}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        parts = [f"{short}={metrics[key]:.4g}" for key, short in SUMMARY_KEYS if key in metrics]
        print(f"[step {step}] " + " ".join(parts), flush=True)
        numeric = {k: v for k, v in metrics.items() if isinstance(v, int | float)}
        if self.tb is not None:
            for key, value in numeric.items():
                self.tb.add_scalar(key, value, step)
        if self.wandb is not None:
            self.wandb.log(numeric, step=step * self.wandb_step_scale)

    def plot(self) -> Path | None:
        """Reward and per-phase time curves as PNG next to metrics.jsonl."""
        return plot_metrics(self.path, self.dir / "curves.png")


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def plot_metrics(metrics_path: str | Path, out: str | Path) -> Path | None:
    """Plot reward (train and eval) and phase times against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    if not records:
        return None
    fig, (ax_r, ax_t) = plt.subplots(1, 2, figsize=(11, 4))
    for key, label in (("rollout/reward_mean", "rollout reward"), ("eval/reward_mean", "eval reward")):
        points = [(r["step"], r[key]) for r in records if key in r]
        if points:
            ax_r.plot(*zip(*points, strict=True), marker="." if "eval" in key else None, label=label)
    ax_r.set_xlabel("rollout step")
    ax_r.set_ylabel("reward")
    ax_r.legend()
    time_keys = ["rollout/time"] + sorted({k for r in records for k in r if k.startswith("time/")})
    for key in time_keys:
        points = [(r["step"], r[key]) for r in records if key in r]
        if points:
            label = "generate" if key == "rollout/time" else key.removeprefix("time/")
            ax_t.plot(*zip(*points, strict=True), label=label)
    ax_t.set_xlabel("rollout step")
    ax_t.set_ylabel("seconds")
    ax_t.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return Path(out)


def tensorboard_dir(args: Any, output_dir: Path) -> str:
    """Where tensorboard logs go, as slime: $TENSORBOARD_DIR, else tensorboard_log/<--tb-project-name>/
    <--tb-experiment-name or the start time>; without either, output-dir/tensorboard."""
    project = getattr(args, "tb_project_name", None)
    if os.environ.get("TENSORBOARD_DIR"):
        return os.environ["TENSORBOARD_DIR"]
    if project is None:
        return str(output_dir / "tensorboard")
    experiment = getattr(args, "tb_experiment_name", None) or datetime.datetime.now().strftime("%Y%m%d_%H%M%S")
    return f"tensorboard_log/{project}/{experiment}"


def wandb_init_kwargs(args: Any, wandb: Any = None) -> dict[str, Any]:
    """wandb.init's arguments from the --wandb-* flags, as slime: --wandb-mode sets WANDB_MODE, --wandb-key/
    --wandb-host log in first (not offline), the run is named after --wandb-group plus a random 6-character suffix
    (unless --disable-wandb-random-suffix), --wandb-dir holds its files, --wandb-run-id names (or resumes) it."""
    key, host = getattr(args, "wandb_key", None), getattr(args, "wandb_host", None)
    mode = getattr(args, "wandb_mode", None)
    if mode:
        os.environ["WANDB_MODE"] = mode
    offline = (mode or os.environ.get("WANDB_MODE")) in ("offline", "disabled")
    if wandb is not None and (key or host) and not offline:
        wandb.login(key=key, host=host)
    group = getattr(args, "wandb_group", None)
    name = group
    if group and getattr(args, "wandb_random_suffix", True):
        name = f"{group}_{secrets.token_hex(3)}"
    config = {k: v for k, v in vars(args).items() if k != "wandb_key"} if args is not None else None
    kwargs = {
        "project": getattr(args, "wandb_project", "slime-like"),
        "entity": getattr(args, "wandb_team", None),
        "group": group,
        "name": name,
        "config": config,
    }
    if getattr(args, "wandb_dir", None):
        os.makedirs(args.wandb_dir, exist_ok=True)
        kwargs["dir"] = args.wandb_dir
    if getattr(args, "wandb_run_id", None):
        kwargs.update(id=args.wandb_run_id, resume="allow")
    return kwargs
