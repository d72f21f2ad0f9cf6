"""LoRA serving: an SGLang server (CPU: torch_native LoRA backend) holds the base and the trainer's adapter; each
update swaps in the new adapter version, and the served log-probs under it equal the Megatron LoRA trainer's.
Two named adapters load side by side, and one batch serves each request under the adapter it names."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from rollout import sglang_client as client
from rollout.sglang_server import SGLangServer
from slime_like.trainer.megatron.lora_flags import sglang_lora_flags
from slime_like.trainer.weights.check import check_servers, probe_tokens, served_logprobs, trainer_logprobs
from slime_like.trainer.weights.lora import LoraTransport

RANK, ALPHA, TARGETS = 4, 8.0, ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
TOLERANCE = 1e-4  # fp32 on both sides
SEQUENCE = [287, 285, 224, 20, 21, 295, 224, 22, 23, 24, 34, 290, 29, 224, 22, 24, 26]
KEEP_ALIVE_S = 2


@pytest.fixture(scope="module")
def lora_server(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangServer]:
    """A float32 server on the tiny Qwen3 with two slots for rank-4 adapters on every linear layer; it closes a
    connection idle for KEEP_ALIVE_S (the transport's kept connection must survive that)."""
    flags = sglang_lora_flags(RANK, TARGETS, adapters=2)
    server = SGLangServer(tiny_qwen3, dtype="float32", extra_args=flags, log_dir=tmp_path_factory.mktemp("l"))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SGLANG_TIMEOUT_KEEP_ALIVE", str(KEEP_ALIVE_S))
        server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("medium", ["tensor", "disk"])
def test_adapter_updates_serve_the_trainers_logprobs(lora_server, tiny_qwen3, tmp_path, medium) -> None:
    """Each update (from shared-memory handles, or from a PEFT directory) serves the trainer's log-probs."""
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.lora import LoraSettings
    from slime_like.trainer.megatron.optimizer import OptimizerSettings
    from slime_like.trainer.megatron.parallel import init_parallel

    init_parallel(tp=1, pp=1, seed=1234)
    settings = LoraSettings(RANK, ALPHA, targets=TARGETS)
    engine = MegatronTrainEngine(tiny_qwen3, OptimizerSettings(lr=3e-2, use_distributed_optimizer=False), lora=settings)
    url = lora_server.url
    transport = LoraTransport([url], settings, str(tiny_qwen3), tmp_path / "lora", medium=medium)
    assert LoraTransport([url], settings, str(tiny_qwen3), tmp_path).medium == "tensor"  # auto: a local server
    source = lambda version: "__tensor__" if medium == "tensor" else str(tmp_path / "lora" / f"v{version}")  # noqa: E731
    probe = probe_tokens(engine.bridge.hf_config.vocab_size)
    base = served_logprobs(url, probe)

    transport.update(engine.export_adapter(), 0)  # the first adapter (B = 0) serves the base's log-probs
    assert client.lora_adapters(url) == {client.LORA_ADAPTER_NAME: source(0)}
    assert check_servers(engine, [url], TOLERANCE, 0, "after version 0") < TOLERANCE
    assert float((served_logprobs(url, probe, lora_path=client.LORA_ADAPTER_NAME) - base).abs().max()) < TOLERANCE

    seq = torch.tensor(SEQUENCE)
    for version in (1, 2):
        loss = lambda lps, data: -sum(lp.sum() for lp in lps) / (len(SEQUENCE) - 1)  # noqa: E731
        engine.train_step([seq], [None], loss)
        transport.update(engine.export_adapter(), version)
        worst = check_servers(engine, [url], TOLERANCE, 0, f"after version {version}")
        assert worst < TOLERANCE, worst
        assert client.weight_version(url) == str(version)
        assert client.lora_adapters(url) == {client.LORA_ADAPTER_NAME: source(version)}
    assert sorted(p.name for p in (tmp_path / "lora").glob("v*")) == ([] if medium == "tensor" else ["v1", "v2"])
    served = served_logprobs(url, probe, lora_path=client.LORA_ADAPTER_NAME)
    torch.testing.assert_close(served, trainer_logprobs(engine, probe), atol=TOLERANCE, rtol=0)
    assert float((served - base).abs().max()) > 1e-2  # the adapter moved the policy; the base is still served
    assert float((served_logprobs(url, probe) - base).abs().max()) < TOLERANCE
    # Generation names the adapter; the update sent the adapter's bytes only.
    answer = client.generate(url, SEQUENCE, {"max_new_tokens": 4, "temperature": 0}, lora_path="policy")
    assert len(answer["output_ids"]) == 4
    full = sum(p.stat().st_size for p in Path(tiny_qwen3).glob("*.safetensors"))
    assert 0 < transport.bytes_sent < full / 4, (transport.bytes_sent, full)
    print(f"adapter update: {transport.bytes_sent} bytes; full weights: {full} bytes; served vs trainer {worst:.2g}")


def test_an_update_is_one_request_that_always_continues(lora_server, tiny_qwen3, tmp_path) -> None:
    """An update is one request per server (rollout/sglang_launch.py's swap: pause, unload, load, version tag,
    continue), which reports the server's seconds per step. The kept connection it goes on is opened again once the
    server closed it. A load the server refuses fails the update with the server's reason, and generation goes on.
    A server without the endpoint (plain sglang.launch_server) answers 404, and then the steps go as separate
    requests; both ways serve the trainer's log-probs."""
    from slime_like.core.errors import EngineError
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.lora import LoraSettings
    from slime_like.trainer.megatron.parallel import init_parallel

    init_parallel(tp=1, pp=1, seed=1234)
    settings = LoraSettings(RANK, ALPHA, targets=TARGETS)
    engine = MegatronTrainEngine(tiny_qwen3, None, lora=settings)
    with torch.no_grad():
        for name, param in engine.model[0].named_parameters():
            if name.endswith(".lora.B"):
                param.normal_(0, 0.05, generator=torch.Generator().manual_seed(3))
    url = lora_server.url
    transport = LoraTransport([url], settings, str(tiny_qwen3), tmp_path / "lora", medium="tensor")
    transport.update(engine.export_adapter(), 11)
    assert {"pause", "load", "continue"} <= set(transport.server_timings[url]), transport.server_timings
    time.sleep(KEEP_ALIVE_S + 1)  # the server closes the idle kept connection
    transport.update(engine.export_adapter(), 12)
    assert client.weight_version(url) == "12"
    assert check_servers(engine, [url], TOLERANCE, 0, "after a swap") < TOLERANCE
    assert set(transport.server_timings[url]) == {"pause", "unload", "load", "continue"}

    too_large = LoraTransport([url], LoraSettings(RANK * 2, ALPHA, targets=TARGETS), str(tiny_qwen3), tmp_path / "x")
    with pytest.raises(EngineError, match="rank 8 is incompatible"):
        too_large.update(engine.export_adapter(), 13)  # the server's adapters are rank 4 at most
    answer = client.generate(url, SEQUENCE, {"max_new_tokens": 2, "temperature": 0}, timeout=30)
    assert len(answer["output_ids"]) == 2  # generation continued after the failed update (a paused server hangs)
    assert client.weight_version(url) == "12"  # and nothing was tagged

    # A route the server lacks answers FastAPI's 404, which swap_lora_adapters reads as "no swap endpoint" (None).
    assert client.KeptAlive(url).post("/no_such_route", {}, 30) == (404, {"detail": "Not Found"})
    separate = LoraTransport([url], settings, str(tiny_qwen3), tmp_path / "lora", medium="tensor")
    separate.one_request = False  # as for a server that answered None
    separate.update(engine.export_adapter(), 15)
    assert client.weight_version(url) == "15" and client.lora_adapters(url) == {client.LORA_ADAPTER_NAME: "__tensor__"}
    assert check_servers(engine, [url], TOLERANCE, 0, "after separate requests") < TOLERANCE
    transport.close()
    separate.close()


def test_two_adapters_serve_side_by_side_in_one_batch(lora_server, tiny_qwen3, tmp_path) -> None:
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.lora import LoraSettings, write_adapter
    from slime_like.trainer.megatron.parallel import init_parallel

    init_parallel(tp=1, pp=1, seed=1234)
    settings = LoraSettings(RANK, ALPHA, targets=TARGETS)
    engine = MegatronTrainEngine(tiny_qwen3, None, lora=settings)
    url, probe, names = lora_server.url, probe_tokens(engine.bridge.hf_config.vocab_size), ("task_a", "task_b")
    base = served_logprobs(url, probe)
    expected = {}
    for seed, name in enumerate(names):  # two different adapters (random B) on one base
        with torch.no_grad():
            g = torch.Generator().manual_seed(seed)
            for param_name, param in engine.model[0].named_parameters():
                if param_name.endswith(".lora.B"):
                    param.copy_(torch.randn(param.shape, generator=g) * 0.05)
        expected[name] = trainer_logprobs(engine, probe)
        client.load_lora_adapter(url, name, str(write_adapter(tmp_path / name, dict(engine.export_adapter()),
                                                              settings, str(tiny_qwen3))))  # fmt: skip
    try:
        assert {n: p for n, p in client.lora_adapters(url).items() if n in names} == {
            n: str(tmp_path / n) for n in names
        }
        # Concurrent requests (one batch on the server): each is served under the adapter it names, or the base.
        with ThreadPoolExecutor(3) as pool:
            futures = {n: pool.submit(served_logprobs, url, probe, lora_path=n) for n in (*names, None)}
        for name in names:
            torch.testing.assert_close(futures[name].result(), expected[name], atol=TOLERANCE, rtol=0)
        torch.testing.assert_close(futures[None].result(), base, atol=TOLERANCE, rtol=0)
        assert float((expected["task_a"] - expected["task_b"]).abs().max()) > 1e-2
    finally:
        for name in names:
            client.unload_lora_adapter(url, name)


def test_multi_lora_steps_each_adapter_alone_and_serves_each(lora_server, tiny_qwen3, tmp_path) -> None:
    """Several adapters trained in one engine (lora_slots.py): a step of one leaves the others bit-identical, an
    adapter trained between steps of another equals the same adapter trained alone, and after each update every
    adapter is served under its name with the trainer's log-probs."""
    from slime_like.trainer.megatron.engine import MegatronTrainEngine
    from slime_like.trainer.megatron.lora import LoraSettings
    from slime_like.trainer.megatron.lora_slots import AdapterSlots
    from slime_like.trainer.megatron.optimizer import OptimizerSettings
    from slime_like.trainer.megatron.parallel import init_parallel
    from slime_like.trainer.weights.lora import MultiLoraTransport

    init_parallel(tp=1, pp=1, seed=1234)
    settings = LoraSettings(RANK, ALPHA, targets=TARGETS)
    engine = MegatronTrainEngine(tiny_qwen3, OptimizerSettings(lr=3e-2, use_distributed_optimizer=False), lora=settings)
    slots = AdapterSlots(engine, ["math", "code", "solo"])
    data = {"math": torch.tensor(SEQUENCE), "code": torch.tensor(SEQUENCE[::-1])}

    def step(name: str, seq: torch.Tensor) -> None:
        slots.activate(name)
        engine.train_step([seq], [None], lambda lps, _: -sum(lp.sum() for lp in lps) / (len(seq) - 1))

    def adapter(name: str) -> dict[str, torch.Tensor]:
        slots.activate(name)
        return {k: v.clone() for k, v in engine.export_adapter()}

    step("solo", data["math"])  # the reference: math's data, trained with nothing in between
    step("solo", data["math"])
    code_start = adapter("code")
    step("math", data["math"])
    math_one = adapter("math")
    assert all(torch.equal(code_start[k], v) for k, v in adapter("code").items())  # math's step left code alone
    step("code", data["code"])
    assert all(torch.equal(math_one[k], v) for k, v in adapter("math").items())  # and code's step left math alone
    step("math", data["math"])  # its second step: its own Adam moments and step count, not code's
    solo, math = adapter("solo"), adapter("math")
    assert max(float((solo[k] - math[k]).abs().max()) for k in solo) == 0.0

    url, probe = lora_server.url, probe_tokens(engine.bridge.hf_config.vocab_size)
    # On disk: the paths the servers report show which version each adapter holds (from tensors they all read
    # "__tensor__"; test_adapter_updates_serve_the_trainers_logprobs covers that medium).
    transport = MultiLoraTransport([url], settings, str(tiny_qwen3), tmp_path / "lora", medium="disk")
    try:
        transport.update(slots.export(["math", "code"]), 1)  # both changed: one pause, each under its name
        step("code", data["code"])
        transport.update(slots.export(["code"]), 2)  # only code changed: math keeps version 1
        held = client.lora_adapters(url)
        assert held["math"] == str(tmp_path / "lora" / "math" / "v1")
        assert held["code"] == str(tmp_path / "lora" / "code" / "v2")
        served = {}
        for name in ("math", "code"):
            slots.activate(name)
            worst = check_servers(engine, [url], TOLERANCE, 0, f"{name} after version 2", lora_path=name)
            assert worst < TOLERANCE, (name, worst)
            served[name] = served_logprobs(url, probe, lora_path=name)
            print(f"multi-LoRA {name}: served vs trainer {worst:.2g}")
        assert float((served["math"] - served["code"]).abs().max()) > 1e-2  # two different policies on one base
        assert transport.bytes_sent > 0
    finally:
        for name in ("math", "code"):
            client.unload_lora_adapter(url, name)


@pytest.mark.slow
def test_a_multi_lora_run_trains_each_adapter_and_passes_the_weight_check(tiny_qwen3: Path, tmp_path: Path) -> None:
    """The whole loop (Ray, SGLang, router, Megatron) with two adapters, each with its own prompts: every update
    loads the changed adapters under their names, the weight check compares each adapter after every update, and
    --save writes each adapter in PEFT format under its name."""
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    flags = []
    for name, op in (("add", "+"), ("mul", "*")):
        rows = [{"prompt": f"{a}{op}{a}=", "label": str(a)} for a in range(4)]
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (tmp_path / f"{name}.yaml").write_text(f"data: {name}.jsonl\nrank: {RANK}\nalpha: {ALPHA}\n")
        flags += ["--multi-lora-adapter", name, str(tmp_path / f"{name}.yaml")]
    (tmp_path / "spread_rm.py").write_text("def reward(args, sample):\n    return float(sum(sample.tokens) % 3)\n")
    out, save = tmp_path / "out", tmp_path / "save"
    cmd = [
        sys.executable, "-m", "slime_like.train", "--hf-checkpoint", str(tiny_qwen3), *flags,
        "--lora-rank", str(RANK), "--lora-alpha", str(ALPHA), "--target-modules", "all-linear",
        "--input-key", "prompt", "--label-key", "label", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
        "--num-rollout", "2", "--rollout-max-response-len", "3", "--advantage-estimator", "reinforce_plus_plus",
        "--custom-rm-path", "spread_rm.reward", "--lr", "1e-2", "--rollout-num-gpus", "1",
        "--check-weight-update", "--check-weight-update-tolerance", str(TOLERANCE), "--output-dir", str(out),
        "--save", str(save), "--save-interval", "2", "--ray-num-cpus", "4",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO_ROOT}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    logs = proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert logs.count("servers match the trainer within") >= 3, logs[-3000:]  # versions 0, 1, 2: both adapters each
    for name in ("add", "mul"):
        assert not list((out / "lora" / name).glob("v*"))  # servers on this machine: loaded from shared memory
        saved = list(save.glob(f"**/lora/{name}/adapter_config.json"))
        assert saved and json.loads(saved[0].read_text())["r"] == RANK
    records = [json.loads(line) for path in out.glob("**/metrics.jsonl") for line in path.read_text().splitlines()]
    trained = [r for r in records if "train/add/loss" in r]
    assert len(trained) == 2 and all("train/mul/loss" in r for r in trained), records  # each adapter, each rollout
    print({k: v for k, v in trained[-1].items() if k.startswith(("train/add/", "train/mul/", "time/update"))})
