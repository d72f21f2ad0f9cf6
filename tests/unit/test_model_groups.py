"""--sglang-config (rollout/model_groups.py): slime's YAML schema parsed and checked against the run's flags, and the
rollout slots handed to each model's engines in file order."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import pytest

from rollout.fleet_plan import model_spec
from rollout.model_groups import load_model_groups, override_flags, place_groups


def model_dir(root: Path, name: str) -> str:
    path = root / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    return str(path)


@pytest.fixture
def args(tmp_path: Path) -> Namespace:
    return Namespace(
        hf_checkpoint=model_dir(tmp_path, "policy"),
        rollout_num_gpus=5,
        rollout_num_gpus_per_engine=1,
        sglang_config=str(tmp_path / "groups.yaml"),
        sglang_server_args=["--max-total-tokens", "4096"],
        precision=None,
        bf16=False,
        fp16=False,
    )


def write(args: Namespace, text: str) -> None:
    Path(args.sglang_config).write_text(text)


def test_a_policy_and_a_frozen_teacher_take_their_slots_in_file_order(args: Namespace, tmp_path: Path) -> None:
    teacher = model_dir(tmp_path, "teacher")
    write(
        args,
        f"""
sglang:
  - name: actor
    server_groups:
      - worker_type: regular
        num_gpus: 2
      - worker_type: placeholder
        num_gpus: 1
  - name: teacher
    model_path: {teacher}
    num_gpus_per_engine: 2
    engine_groups:
      - worker_type: regular
        num_gpus: 2
        overrides: {{dtype: float32, mem_fraction_static: 0.5, disable_radix_cache: true, skip_tokenizer_init: false}}
""",
    )
    actor, frozen = load_model_groups(args)
    # update_weights inferred as slime does: the model served from --hf-checkpoint is the policy.
    assert (actor.name, actor.model_path, actor.update_weights) == ("actor", args.hf_checkpoint, True)
    assert (frozen.name, frozen.model_path, frozen.update_weights) == ("teacher", teacher, False)
    assert frozen.server_groups[0].num_gpus_per_engine == 2  # the model's default reaches its groups
    spec = model_spec(args, frozen, frozen.server_groups[0])
    assert spec.dtype == "float32" and spec.update_weights is False and spec.num_gpus_per_engine == 2
    # Overrides come after the --sglang-* passthrough (the last flag wins in SGLang's parser); false adds nothing.
    assert spec.extra_args == ["--max-total-tokens", "4096", "--mem-fraction-static", "0.5", "--disable-radix-cache"]
    slots = list("abcde")
    # actor: engines on a, b; c is the placeholder's; teacher: one engine of two slots, d and e.
    assert place_groups([actor, frozen], slots) == {"actor": [["a"], ["b"]], "teacher": [["d", "e"]]}


def test_override_flags_spell_server_args_fields_as_flags() -> None:
    assert override_flags({"context_length": 32768, "enable_torch_compile": True, "json_model_override_args": None,
                           "cuda_graph_bs": [1, 2]}) == ["--context-length", "32768", "--enable-torch-compile",
                                                         "--cuda-graph-bs", "1", "2"]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("models: []", "top-level `sglang:` list"),
        ("sglang:\n  - name: a\n    server_groups:\n      - {worker_type: prefill, num_gpus: 5}",
         "worker_type prefill (disaggregated serving) is not supported here: prefill/decode disaggregation moves"),
        ("sglang:\n  - name: a\n    server_groups:\n      - {worker_type: regular, num_gpus: 4}",
         "its groups take 4 GPUs in all, but --rollout-num-gpus is 5: set --rollout-num-gpus 4"),
        ("sglang:\n  - name: a\n    replicas: 2\n    server_groups:\n      - {worker_type: regular, num_gpus: 5}",
         "model 'a': unknown keys ['replicas']"),
        ("sglang:\n  - name: a\n    server_groups:\n      - {worker_type: regular, num_gpus: 5, num_gpus_per_engine: 2}",
         "num_gpus 5 is not a multiple of num_gpus_per_engine 2"),
        ("sglang:\n  - name: a\n    server_groups:\n      - {worker_type: regular, num_gpus: 3}\n"
         "  - name: b\n    server_groups:\n      - {worker_type: regular, num_gpus: 2}",
         "exactly one model must receive the trainer's weights (update_weights: true, or model_path = "
         "--hf-checkpoint): it generates the rollouts; found ['a', 'b']"),
        ("sglang:\n  - name: a\n    model_path: /no/such\n    server_groups:\n      - {worker_type: regular, num_gpus: 5}",
         "model 'a': model_path /no/such holds no Hugging Face config.json"),
    ],
)  # fmt: skip
def test_what_this_machine_or_the_run_cannot_serve_is_refused_naming_the_fix(
    args: Namespace, body: str, message: str
) -> None:
    write(args, body)
    with pytest.raises(ValueError, match="^--sglang-config ") as error:
        load_model_groups(args)
    assert message in str(error.value)
