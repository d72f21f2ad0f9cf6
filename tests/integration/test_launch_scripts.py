"""Every shipped launch script passes its dry run; wrong or contradicting flags fail naming them."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.conftest import REPO_ROOT
from tools.reference_configs import write_reference_config

# The CPU scripts (run-*-cpu*.sh) build their model and run for real; the cluster scripts are checked by dry run.
SCRIPTS = sorted(p.name for p in (REPO_ROOT / "scripts").glob("run-*.sh") if "-cpu" not in p.name)


def model_of(script: str) -> str:
    return script.removeprefix("run-").removesuffix(".sh")


# Dry runs with wrong flags or the wrong config: (script, config of model, extra flags).
BAD = {
    "contradicting": ("run-qwen3-4B.sh", "qwen3-4B", ("--num-query-groups", "4")),
    "other_config": ("run-qwen3-8B.sh", "qwen3-4B", ()),
    "misspelt": ("run-qwen3-4B.sh", "qwen3-4B", ("--tensor-model-paralel-size", "4")),
    "too_big": ("run-deepseek-v3.sh", "deepseek-v3", ("--gpu-memory-gb", "40")),
}
# Dry runs of a script's optional mode, switched on by its environment: (script, config of model, environment).
MODES = {"glm_mtp": ("run-glm4.7-flash.sh", "glm4.7-flash", {"ENABLE_MTP": "1"})}


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess[str]]:
    """Every script's dry run and every bad one, side by side (each is mostly Python start-up: ~6 s alone)."""
    configs = tmp_path_factory.mktemp("configs")
    for script in SCRIPTS:
        write_reference_config(model_of(script), configs / model_of(script))
    cases = {s: (s, model_of(s), (), {}) for s in SCRIPTS} | {k: (*v, {}) for k, v in BAD.items()}
    cases |= {k: (script, model, (), env) for k, (script, model, env) in MODES.items()}
    procs = {}
    for name, (script, model, extra, mode) in cases.items():
        env = {**os.environ, "DRY_RUN": "1", "HF_CHECKPOINT": str(configs / model), **mode}
        cmd = ["bash", str(REPO_ROOT / "scripts" / script), *extra]
        procs[name] = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    done = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return done


def test_every_model_has_a_script() -> None:
    models = {p.stem for p in (REPO_ROOT / "scripts" / "models").glob("*.sh")} - {"tiny-cpu"}
    assert {s.removeprefix("run-").removesuffix(".sh") for s in SCRIPTS} == models


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_dry_run_passes(script: str, dry_runs: dict[str, subprocess.CompletedProcess[str]]) -> None:
    out = dry_runs[script]
    model_type = (
        json.loads((REPO_ROOT / "tools" / "hf_configs" / f"{model_of(script)}.json").read_text())["model_type"]
        if (REPO_ROOT / "tools" / "hf_configs" / f"{model_of(script)}.json").exists()
        else None
    )
    from slime_like.trainer.megatron.families import FAMILIES

    if model_type is not None and model_type not in FAMILIES:  # a family still being registered: its clear error
        assert out.returncode == 2 and "no model family is registered" in out.stderr, out.stdout + out.stderr
        return
    assert out.returncode == 0, out.stdout + out.stderr
    assert "dry run: OK, nothing started" in out.stdout
    assert "memory per training GPU" in out.stdout and "placement:" in out.stdout


def test_glm_flash_with_mtp_training_passes_its_dry_run(dry_runs: dict[str, subprocess.CompletedProcess[str]]) -> None:
    """run-glm4.7-flash.sh with ENABLE_MTP=1: slime's MTP flags and EAGLE decoding, checked against the config."""
    out = dry_runs["glm_mtp"]
    assert out.returncode == 0 and "dry run: OK, nothing started" in out.stdout, out.stdout + out.stderr
    # MTP training at slime's layout: PP 2 (the MTP layer on the last stage) x CP 2.
    assert "TP 2 x PP 2 x CP 2" in out.stdout and "--enable-mtp-training" not in out.stderr


def test_flag_contradicting_the_hf_config_names_both(dry_runs: dict[str, subprocess.CompletedProcess[str]]) -> None:
    out = dry_runs["contradicting"]
    assert out.returncode == 2
    assert "--num-query-groups 4 contradicts num_key_value_heads=8 in the HF config" in out.stderr


def test_script_against_another_models_config_fails(dry_runs: dict[str, subprocess.CompletedProcess[str]]) -> None:
    out = dry_runs["other_config"]
    assert out.returncode == 2
    assert "--hidden-size 4096 contradicts hidden_size=2560" in out.stderr
    assert "--untie-embeddings-and-output-weights is set but the HF config has tie_word_embeddings=True" in out.stderr


def test_misspelt_flag_fails(dry_runs: dict[str, subprocess.CompletedProcess[str]]) -> None:
    out = dry_runs["misspelt"]
    assert out.returncode == 2 and "unrecognized arguments: --tensor-model-paralel-size 4" in out.stderr


def test_plan_that_cannot_fit_is_refused_with_what_to_change(
    dry_runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    out = dry_runs["too_big"]
    assert out.returncode == 1
    assert "raise --tensor-model-parallel-size" in out.stdout
    assert "raise --rollout-num-gpus-per-engine" in out.stdout
