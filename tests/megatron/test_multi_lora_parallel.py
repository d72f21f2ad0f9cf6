"""Multi-LoRA (--multi-lora-adapter) on two ranks and across a checkpoint: DP=2 and TP=2 train every adapter as one
process does, an adapter with no samples stays bit-identical, and --save then --load restores every adapter with
its optimizer state and schedule position (the step after the load equals the step without it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.megatron.algo_common import make_data
from tests.megatron.launch import torchrun

WORKER = Path(__file__).with_name("multi_lora_worker.py")
NAMES = ("a", "b", "c")  # c never gets a sample: it must stay the starting adapter
# Rollout 0: groups of a and b in both optimizer steps; rollout 1: a only, so b must not move. At DP 2 the first
# step's token-balanced split gives one rank both samples of a and the other both of b: each adapter steps with a
# rank that holds none of its rows.
ROLLOUTS = (["a", "b", "b", "a"], ["a", "a", "a", "a"])
LAYOUTS = {"dp2": {"dp": 2, "tp": 1}, "tp2": {"dp": 1, "tp": 2}}


def write_configs(directory: Path) -> None:
    """One adapter config (miles' adapter.yaml shape) and prompt file per name: the flags need them to parse."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        (directory / f"{name}.jsonl").write_text('{"input": "x", "label": "1"}\n')
        (directory / f"{name}.yaml").write_text(f"data: {name}.jsonl\n")


def multi_lora_args(hf_dir: str | Path, configs: str | Path, dp: int = 1, tp: int = 1):
    """A trainer rank's arguments: three rank-4 adapters, two optimizer steps per rollout of 8 samples, the learning
    rate decaying linearly over the steps (each adapter's schedule position shows in its steps)."""
    from slime_like.arguments import parse_args

    adapters = [x for name in NAMES for x in ("--multi-lora-adapter", name, str(Path(configs) / f"{name}.yaml"))]
    return parse_args(
        ["--hf-checkpoint", str(hf_dir), "--rollout-batch-size", "4", "--n-samples-per-prompt", "2",
         "--global-batch-size", "4", "--num-rollout", "2", "--lr", "1e-2", "--max-tokens-per-gpu", "12",
         "--rollout-max-response-len", "8", "--actor-num-gpus-per-node", str(dp * tp),
         "--tensor-model-parallel-size", str(tp), "--lora-rank", "4", "--lora-alpha", "8",
         "--target-modules", "all-linear", "--lr-decay-style", "linear", *adapters]
    )  # fmt: skip


def rollout(index: int):
    """The fixed rollout of algo_common, each group tagged with its adapter (and rewards that move both steps)."""
    data = make_data()
    data.raw_rewards[4:6] = [0.0, 1.0]  # group 2 would have zero advantages
    data.lora_adapters = [name for name in ROLLOUTS[index] for _ in range(2)]
    return data


def adapters(actor) -> dict[str, torch.Tensor]:
    """Every adapter of the actor in PEFT form, `<name>/<key>` (a collective over TP)."""
    return {k: v.clone() for k, v in actor.lora_slots.export(list(NAMES))}


def run_layout(actor_cls, hf_dir, configs, checkpoint: Path, *, rank=0, addr="127.0.0.1", port=0, dp=1, tp=1) -> dict:
    """Two rollouts, saving after the first; then a new trainer loads that checkpoint and takes the second again.
    Returns the adapters at start, after each rollout and after the resumed rollout, and the metrics."""
    args = multi_lora_args(hf_dir, configs, dp, tp)
    actor = actor_cls(args, rank, addr, port)
    out = {"start": adapters(actor), "metrics": []}
    for index in range(2):
        out["metrics"].append(actor.train(index, rollout(index)))
        if index == 0:  # before the export below swaps every adapter in and out
            actor.save(str(checkpoint), iteration=0)
        out[f"after{index}"] = adapters(actor)
    resumed = actor_cls(args, rank, addr, port)
    resumed.load(str(checkpoint))
    out["loaded"] = adapters(resumed)
    out["resumed_metrics"] = resumed.train(1, rollout(1))
    out["resumed"] = adapters(resumed)
    out["checkpoint"] = str(checkpoint)
    return out


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], name: str) -> bool:
    """Whether adapter `name` is bit-identical in two exports."""
    keys = [k for k in a if k.startswith(f"{name}/")]
    assert keys and sorted(keys) == sorted(k for k in b if k.startswith(f"{name}/")), name
    return all(torch.equal(a[k], b[k]) for k in keys)


@pytest.fixture(scope="module")
def one_process(tiny_qwen3, megatron_world, tmp_path_factory) -> dict:
    from slime_like.trainer.actor import TrainActor

    configs = tmp_path_factory.mktemp("configs")
    write_configs(configs)
    saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    try:
        return run_layout(TrainActor, tiny_qwen3, configs, tmp_path_factory.mktemp("ckpt") / "iter_0000000")
    finally:  # TrainActor sets them
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _check_one_run(run: dict) -> None:
    """Within one run: b does not move in rollout 1 (a only), c never moves, a and b moved in rollout 0."""
    assert _same(run["after0"], run["after1"], "b")
    for stage in ("after0", "after1", "resumed"):
        assert _same(run["start"], run[stage], "c")
    assert not _same(run["start"], run["after0"], "a") and not _same(run["start"], run["after0"], "b")
    assert not _same(run["after0"], run["after1"], "a")
    # The resumed trainer holds every adapter as saved, and its step equals the step taken without the save/load.
    for name in NAMES:
        assert _same(run["loaded"], run["after0"], name), name
        assert _same(run["resumed"], run["after1"], name), name
    assert _metrics(run["resumed_metrics"]) == _metrics(run["metrics"][1])


def _metrics(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if not k.startswith("time/")}


def test_one_process_steps_each_adapter_alone_and_resumes_exactly(one_process) -> None:
    _check_one_run(one_process)
    assert {k.split("/")[1] for k in one_process["metrics"][0] if k.startswith("train/")} == {"a", "b"}
    assert {k.split("/")[1] for k in one_process["metrics"][1] if k.startswith("train/")} == {"a"}


def test_load_takes_a_subset_and_names_what_the_checkpoint_lacks(one_process, tiny_qwen3, tmp_path) -> None:
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.lora import LoraSettings
    from slime_like.trainer.megatron.lora_slots import AdapterSlots
    from slime_like.trainer.megatron.optimizer import OptimizerSettings

    engine = MegatronTrainEngine(tiny_qwen3, OptimizerSettings(lr=1e-2), lora=LoraSettings(4, 8.0))
    with pytest.raises(ValueError, match="holds the adapters a, b, c, not z: resume with the adapters it holds"):
        AdapterSlots(engine, ["b", "z"]).load(one_process["checkpoint"])
    with pytest.raises(ValueError, match=r"holds no multi-LoRA adapter states \(lora_state/<name>/\)"):
        AdapterSlots(engine, ["b"]).load(tmp_path)
    # b alone, weights only (--no-load-optim, --finetune): as it was saved.
    AdapterSlots(engine, ["b"]).load(one_process["checkpoint"], load_optimizer=False)
    assert _same({f"b/{k}": v for k, v in engine.export_adapter()}, one_process["after0"], "b")


def test_dp2_and_tp2_match_one_process(one_process, tiny_qwen3, tmp_path) -> None:
    """Both layouts in one torchrun (one start-up). DP=2 sums gradients in another order; TP=2 also splits the
    matmuls, the vocab softmax and the row-parallel A's input sum, so fp32 rounds differently. Adam turns that into
    weight differences below 1e-6, except on elements whose gradient is of the order of its eps (1e-8), where its
    step is proportional to the gradient itself. Measured: 1 of the 8192 exported elements of each adapter differs
    by more than 1e-6 at TP=2, by up to 2.5e-5 on a step of 3.1e-3 (0.8% of it; the other elements of that A moved
    the full 0.74 * lr = 5.6e-3 of a B=0 adapter's first non-zero gradient); DP=2 differs by 4.8e-7 at most. A
    swapped adapter, Adam state or schedule position is off by the order of lr (1e-2)."""
    configs = tmp_path / "configs"
    write_configs(configs)
    torchrun(WORKER, [str(tmp_path / "out.pt"), str(tiny_qwen3), str(configs), str(tmp_path), *LAYOUTS])
    results = torch.load(tmp_path / "out.pt", weights_only=False)
    for layout, got in results.items():
        _check_one_run(got)
        for stage in ("after0", "after1"):
            for key, ref in one_process[stage].items():
                if key.startswith(("a/", "b/")):
                    torch.testing.assert_close(
                        got[stage][key] - one_process["start"][key],
                        ref - one_process["start"][key],
                        atol=1e-6,
                        rtol=2e-2,
                        msg=lambda m, where=f"{layout} {stage} {key}": f"{where}: {m}",
                    )
        for ours, ref in zip(got["metrics"], one_process["metrics"], strict=True):
            ours, ref = _metrics(ours), _metrics(ref)
            assert sorted(ours) == sorted(ref)
            for key, value in ref.items():
                assert ours[key] == pytest.approx(value, abs=1e-5, rel=1e-4), (layout, key)
