"""Delta weight sync into a real SGLang server: after each training step the host-local checkpoint, patched by
the published deltas only, holds exactly the tensors a full sync would write, and the server reloaded from it
scores like the trainer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rollout import delta_pull
from rollout.sglang_client import weight_version
from rollout.sglang_server import SGLangServer
from slime_like.trainer.weights.check import served_logprobs
from slime_like.trainer.weights.delta import DeltaDiskTransport

pytestmark = [pytest.mark.integration, pytest.mark.megatron]

SEQUENCE = [287, 285, 224, 20, 21, 295, 224, 22, 23, 24, 34, 290, 29, 224, 22, 24, 26]
TOLERANCE = 1e-4  # fp32 on both sides, as the full-sync tests (test_weight_update.py)


@pytest.fixture(scope="module")
def server(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangServer]:
    """A server of this module's own: its weights change."""
    with SGLangServer(tiny_qwen3, dtype="float32", log_dir=tmp_path_factory.mktemp("logs"), startup_timeout=300) as s:
        yield s


def local_weights(local: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for path in local.glob("*.safetensors"):
        out.update(load_file(str(path)))
    return out


@pytest.mark.parametrize("encoding", ["xor"])
def test_delta_updates_equal_a_full_sync(server, tiny_qwen3: Path, tmp_path: Path, encoding: str) -> None:
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.optimizer import OptimizerSettings
    from slime_like.trainer.megatron.parallel import init_parallel

    init_parallel(tp=1, pp=1, seed=1234)
    engine = MegatronTrainEngine(tiny_qwen3, OptimizerSettings(lr=1e-3, use_distributed_optimizer=False))
    local, shared = tmp_path / "local", tmp_path / "shared"

    def pull(version: int, chain: str) -> list[dict]:  # what each engine node actor runs on its host
        return [delta_pull.pull(local, tiny_qwen3, shared, version, chain)]

    transport = DeltaDiskTransport(
        [server.url], 1 << 20, hf_checkpoint=str(tiny_qwen3), disk_dir=str(shared), local_dir=str(local),
        encoding=encoding, pull=pull, timeout_s=120,
    )  # fmt: skip
    before = served_logprobs(server.url, SEQUENCE)
    for version in (1, 2, 3):
        engine.train_step([torch.tensor(SEQUENCE)], [None], lambda lps, data: -lps[0].mean())
        expected = engine.forward_logprobs([SEQUENCE])[0]
        transport.update(engine.export_hf_weights(), version)
        full = {name: t.detach().clone() for name, t in engine.export_hf_weights()}  # what a full sync sends
        patched = local_weights(local)
        assert full.keys() <= patched.keys()
        assert all(torch.equal(patched[name], t) for name, t in full.items())
        served = served_logprobs(server.url, SEQUENCE)
        assert (served - expected).abs().max() < TOLERANCE
        assert weight_version(server.url) == str(version)
        stats = transport.stats
        assert 0 < stats["written_bytes"] < stats["model_bytes"]  # compressed deltas, not the model
    assert (served - before).abs().max() > 1e-3  # the weights really moved
    assert delta_pull.read_state(local) == {"chain": transport.chain, "version": 3}


def test_a_run_with_delta_sync_passes_the_weight_check(tiny_qwen3: Path, tmp_path: Path) -> None:
    """The whole loop (Ray, two engines, router, Megatron) with slime's delta flags: every update is applied by the
    engines' node actors on their host (both engines share this one: the second finds each version applied), and the
    weight check after every update passes."""
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    rows = [{"prompt": f"{a}+{a}=", "label": str(2 * a)} for a in range(4)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # Rewards that differ between prompts: every step has a gradient, so every version has something to send.
    (tmp_path / "spread_rm.py").write_text("def reward(args, sample):\n    return float(sum(sample.tokens) % 3)\n")
    shared, local, out = tmp_path / "shared", tmp_path / "nvme", tmp_path / "out"
    cmd = [
        sys.executable, "-m", "slime_like.train",
        "--hf-checkpoint", str(tiny_qwen3), "--prompt-data", str(tmp_path / "train.jsonl"),
        "--input-key", "prompt", "--label-key", "label", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
        "--num-rollout", "2", "--rollout-max-response-len", "3", "--rollout-top-k", "1",
        "--advantage-estimator", "reinforce_plus_plus", "--custom-rm-path", "spread_rm.reward", "--lr", "1e-2",
        "--rollout-num-gpus", "2",
        "--update-weight-mode", "delta", "--update-weight-transport", "disk", "--update-weight-disk-dir", str(shared),
        "--update-weight-local-checkpoint-dir", str(local), "--update-weight-delta-encoding", "overwrite",
        "--check-weight-update", "--output-dir", str(out), "--ray-num-cpus", "4",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO_ROOT}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "servers match the trainer within" in proc.stdout + proc.stderr
    for version in (1, 2):
        index = json.loads((shared / f"weight_v{version:06d}" / "model.safetensors.index.json").read_text())
        assert index["metadata"]["delta_encoding"] == "overwrite"
        assert index["metadata"]["base_version"] == version - 1
        assert index["weight_map"], f"version {version} changed nothing: the run did not train"
    assert delta_pull.read_state(local)["version"] == 2
