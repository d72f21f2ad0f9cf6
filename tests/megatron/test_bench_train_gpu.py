"""scripts/bench/bench_train_gpu.py --tiny runs on CPU and prints its figures, with a FLOPs count that matches
the parameters Megatron actually built."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from tests.conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "bench" / "bench_train_gpu.py"


def test_tiny_run_prints_throughput_and_mfu(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--peak-tflops", "1", "--json", str(out), "--workdir", str(tmp_path)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = proc.stdout[proc.stdout.index("device:") :].splitlines()
    device = "cpu" if not torch.cuda.is_available() else torch.cuda.get_device_name()
    assert table[0].startswith(f"device: {device} (peak 1 TFLOP/s dense bf16)")
    assert table[1].split()[:6] == ["model", "params", "active", "step", "s", "tokens/s"] and "MFU" in table[1]
    rows = {line.split()[0]: line.split() for line in table[2:]}
    assert set(rows) == {"tiny-dense", "tiny-moe"}

    figures = json.loads(out.read_text())
    assert figures["device"] == device and figures["peak_flops"] == 1e12
    for r in figures["results"]:
        assert r["params"] == r["params_megatron"]  # the analytic count behind the FLOPs is the built model's
        assert len(r["step_s_all"]) == 2 and r["tokens_per_step"] == 4 * 64
        assert r["tokens_per_s"] == r["tokens_per_step"] / r["step_s_median"] > 0
        shape = r["shape"]
        per_token = 6 * r["active_params"] + 12 * shape["layers"] * shape["heads"] * shape["head_dim"] * 64
        assert abs(r["model_tflops"] - r["tokens_per_s"] * per_token / 1e12) < 1e-9
        assert r["mfu"] == r["model_tflops"]  # peak 1 TFLOP/s
        printed = rows[r["model"]]
        assert float(printed[4]) == round(r["tokens_per_s"], 1)
        assert printed[6] == f"{100 * r['mfu']:.1f}%"
    dense, moe = figures["results"]
    assert dense["active_params"] == dense["params"]  # tied embedding: counted once, as the output layer
    assert moe["active_params"] < moe["params"]  # 2 of 4 experts per token, and the untied input embedding


def test_hybrid_shapes_count_the_parameters_transformers_builds() -> None:
    """The bench's analytic parameter count (behind its FLOPs) of the Qwen3-Next / Qwen3.5 shapes, full and tiny,
    against transformers' model of the config it writes (on the meta device: no memory, no weights); Qwen3.5's
    one-block vision tower is left out of both."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_train_gpu", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, bench)  # its dataclasses look their module up there
    spec.loader.exec_module(sys.modules[spec.name])
    bench = sys.modules[spec.name]
    for key in ("qwen3-next", "qwen3.5", "qwen3.5-moe"):
        for shape in bench.SHAPES[key]:
            with torch.device("meta"):
                model = bench.hf_model_class(shape).from_config(bench.hf_config(shape, 4096))
            text = sum(p.numel() for name, p in model.named_parameters() if ".visual." not in f".{name}")
            total, active = shape.params()
            assert total == text, shape.name
            assert (active < total) == bool(shape.experts)  # top-k of the experts; dense ones are tied
