"""Delta weight sync into a real SGLang server: after each training step the host-local checkpoint, patched by
the published deltas only, holds exactly the tensors a full sync would write, and the server reloaded from it
scores like the trainer."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

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
def server(pause_server: SGLangServer) -> SGLangServer:
    """The session's server whose weights tests change (tests/integration/conftest.py). What it serves before the
    first update does not matter here: each update loads a whole checkpoint, the base patched by the deltas."""
    return pause_server


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


def test_a_run_with_delta_sync_passes_the_weight_check(delta_run_on_one_node: SimpleNamespace) -> None:
    """The whole loop (Ray, two engines, router, Megatron on two ranks) with slime's delta flags (the session's
    delta_run_on_one_node): every update is applied by the engines' node actors on their host (both engines share this
    one: the second finds each version applied), and the weight check after every update passes."""
    run = delta_run_on_one_node
    assert "servers match the trainer within" in run.output
    for version in (1, 2):
        index = json.loads((run.shared / f"weight_v{version:06d}" / "model.safetensors.index.json").read_text())
        assert index["metadata"]["delta_encoding"] == "overwrite"
        assert index["metadata"]["base_version"] == version - 1
        assert index["weight_map"], f"version {version} changed nothing: the run did not train"
    assert delta_pull.read_state(run.local)["version"] == 2
