"""Every shipped launch script passes its dry run; wrong or contradicting flags fail naming them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tools.reference_configs import write_reference_config

# The CPU demo scripts build their model and run for real; the cluster scripts are checked by dry run.
SCRIPTS = sorted(p.name for p in (REPO_ROOT / "scripts").glob("run-*.sh") if not p.name.startswith("run-tiny-cpu"))


def dry_run(script: str, hf_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DRY_RUN": "1", "HF_CHECKPOINT": str(hf_dir)}
    return subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / script), *extra], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def configs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("configs")
    for script in SCRIPTS:
        model = script.removeprefix("run-").removesuffix(".sh")
        write_reference_config(model, root / model)
    return root


def test_every_model_has_a_script() -> None:
    models = {p.stem for p in (REPO_ROOT / "scripts" / "models").glob("*.sh")} - {"tiny-cpu"}
    assert {s.removeprefix("run-").removesuffix(".sh") for s in SCRIPTS} == models


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_dry_run_passes(script: str, configs: Path) -> None:
    out = dry_run(script, configs / script.removeprefix("run-").removesuffix(".sh"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "dry run: OK, nothing started" in out.stdout
    assert "memory per training GPU" in out.stdout and "placement:" in out.stdout


def test_flag_contradicting_the_hf_config_names_both(configs: Path) -> None:
    out = dry_run("run-qwen3-4B.sh", configs / "qwen3-4B", "--num-query-groups", "4")
    assert out.returncode == 2
    assert "--num-query-groups 4 contradicts num_key_value_heads=8 in the HF config" in out.stderr


def test_script_against_another_models_config_fails(configs: Path) -> None:
    out = dry_run("run-qwen3-8B.sh", configs / "qwen3-4B")
    assert out.returncode == 2
    assert "--hidden-size 4096 contradicts hidden_size=2560" in out.stderr
    assert "--untie-embeddings-and-output-weights is set but the HF config has tie_word_embeddings=True" in out.stderr


def test_misspelt_flag_fails(configs: Path) -> None:
    out = dry_run("run-qwen3-4B.sh", configs / "qwen3-4B", "--tensor-model-paralel-size", "4")
    assert out.returncode == 2 and "unrecognized arguments: --tensor-model-paralel-size 4" in out.stderr


def test_plan_that_cannot_fit_is_refused_with_what_to_change(configs: Path) -> None:
    out = dry_run("run-deepseek-v3.sh", configs / "deepseek-v3", "--gpu-memory-gb", "40")
    assert out.returncode == 1
    assert "raise --tensor-model-parallel-size" in out.stdout
    assert "raise --rollout-num-gpus-per-engine" in out.stdout
