"""tools/make_student.py: the student is the teacher without the dropped layers (logits equal a transformers model
whose layer list was cut by hand), with the teacher's tokenizer; bad layer choices fail naming the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tools.make_student import main, make_student, parse_layers
from tools.make_student_task import CAPITALS, score, write_data


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen3 with 4 layers (Qwen3's config has per-layer `layer_types`)."""
    from tools.make_tiny_model import make_tiny_model, parse_args

    out = tmp_path_factory.mktemp("teacher")
    return make_tiny_model(parse_args(["--out", str(out), "--family", "qwen3", "--num-layers", "4"]))


def logits(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens).logits


def test_student_is_the_teacher_without_the_dropped_layers(teacher: Path, tmp_path: Path) -> None:
    import transformers

    student = make_student(teacher, tmp_path / "student", [1, 2])
    config = json.loads((student / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and len(config["layer_types"]) == 2
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (student / name).read_bytes() == (teacher / name).read_bytes()

    # Independently: the teacher loaded by transformers with its layer list cut to layers 0 and 3.
    cut = transformers.AutoModelForCausalLM.from_pretrained(teacher, dtype=torch.float32).eval()
    full = logits(cut, tokens := torch.tensor([[5, 17, 42, 8, 99, 3]]))
    cut.model.layers = torch.nn.ModuleList([cut.model.layers[0], cut.model.layers[3]])
    for index, layer in enumerate(cut.model.layers):
        layer.self_attn.layer_idx = index
    cut.config.num_hidden_layers = 2
    made = transformers.AutoModelForCausalLM.from_pretrained(student, dtype=torch.float32).eval()
    assert sum(p.numel() for p in made.parameters()) < sum(p.numel() for p in cut.parameters()) + 1
    torch.testing.assert_close(logits(made, tokens), logits(cut, tokens), atol=0, rtol=0)
    assert not torch.allclose(logits(made, tokens), full)  # the dropped layers mattered


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("4", "--drop-layers [4]: the teacher has layers 0..3 only"),
        ("0-3", "--drop-layers drops all 4 layers: keep at least one"),
        ("one", "use layer numbers and ranges, e.g. 12-15,20"),
    ],
)
def test_bad_layer_choices_are_refused(teacher: Path, tmp_path: Path, spec: str, message: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--teacher", str(teacher), "--out", str(tmp_path / "s"), "--drop-layers", spec])
    assert message in str(exit_.value)
    assert not (tmp_path / "s").exists()


def test_layer_spec() -> None:
    assert parse_layers("12-15, 20,3") == [3, 12, 13, 14, 15, 20]


def test_task_data_and_score(tmp_path: Path) -> None:
    train, heldout = write_data(tmp_path, heldout=10)
    rows = [json.loads(line) for path in (train, heldout) for line in path.read_text().splitlines()]
    assert len(rows) == len(CAPITALS) and len(heldout.read_text().splitlines()) == 10
    assert {r["label"] for r in rows} == {capital for _, capital in CAPITALS}  # every country once, no overlap
    assert score("The capital of Saudi Arabia is Riyadh.", "Riyadh") == 1.0
    assert score("The capital of France is Lyon.", "Paris") == 0.0


def test_post_process_trains_on_zero_and_reports_the_task_score() -> None:
    from slime_like.core.sample import Sample, Status
    from tools.make_student_task import post_process_rewards

    def sample(i: int, reward: float, teacher: list[float] | None) -> Sample:
        return Sample(index=i, reward=reward, response_length=2, status=Status.COMPLETED, teacher_log_probs=teacher)

    raw, rewards = post_process_rewards(None, [sample(0, 1.0, [-0.1, -0.2]), sample(1, 0.0, [-1.0, -2.0])])
    assert raw == [1.0, 0.0] and rewards == [0.0, 0.0]
    with pytest.raises(ValueError, match="slime.rollout.on_policy_distillation.reward_func"):
        post_process_rewards(None, [sample(0, 1.0, None)])  # the teacher was never asked
