"""Data source: parsing, bad rows, epochs, resume."""

from __future__ import annotations

import json
from pathlib import Path

# reasoning_gym imports matplotlib, whose first import on a machine builds its font cache by running `fc-list`: done
# here, at collection, before the unit tier's no-subprocess guard (tests/unit/conftest.py) is in place.
import matplotlib.font_manager  # noqa: F401
import pytest

from buffer.buffer import Buffer
from buffer.data_source import DataError, DataSource, PromptDataset


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.fixture
def ten_rows(tmp_path: Path) -> Path:
    return write_jsonl(
        tmp_path / "d.jsonl", [{"prompt": f"q{i}", "label": str(i), "metadata": {"i": i}} for i in range(10)]
    )


def test_groups_have_n_samples_with_indices(ten_rows: Path) -> None:
    source = DataSource(PromptDataset(ten_rows), n_samples_per_prompt=3, shuffle=False)
    groups = source.get_groups(2)
    assert [[s.index for s in g] for g in groups] == [[0, 1, 2], [3, 4, 5]]
    assert [g[0].prompt for g in groups] == ["q0", "q1"]
    assert groups[1][2].label == "1" and groups[1][2].metadata == {"i": 1}
    # Samples of a group are independent objects.
    groups[0][0].metadata["x"] = 1
    assert "x" not in groups[0][1].metadata


def test_every_prompt_once_per_epoch_and_reshuffled(ten_rows: Path) -> None:
    source = DataSource(PromptDataset(ten_rows), n_samples_per_prompt=1, shuffle=True, seed=3)
    epoch0 = [g[0].prompt for g in source.get_groups(10)]
    epoch1 = [g[0].prompt for g in source.get_groups(10)]
    assert sorted(epoch0) == sorted(epoch1) == sorted(f"q{i}" for i in range(10))
    assert epoch0 != epoch1  # a different permutation per epoch


def test_resume_continues_with_next_unseen_prompt(ten_rows: Path) -> None:
    a = Buffer(DataSource(PromptDataset(ten_rows), 2, seed=1))
    a.get_groups(7)
    a.add_groups(a.get_groups(1))  # one group handed back waits in the buffer
    state = json.loads(json.dumps(a.state_dict()))  # must survive JSON
    expected = [[s.prompt for s in g] for g in a.get_groups(6)]
    b = Buffer(DataSource(PromptDataset(ten_rows), 2, seed=1))
    b.load_state_dict(state)
    assert [[s.prompt for s in g] for g in b.get_groups(6)] == expected


def test_buffer_serves_returned_groups_first(ten_rows: Path) -> None:
    buf = Buffer(DataSource(PromptDataset(ten_rows), 1, shuffle=False))
    first = buf.get_groups(2)
    buf.add_groups(first[1:])
    assert [g[0].prompt for g in buf.get_groups(2)] == ["q1", "q2"]


def test_bad_json_row_names_file_and_line(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "bad.jsonl", [{"prompt": "a", "label": "1"}, "{not json", {"prompt": "b", "label": "2"}]
    )
    with pytest.raises(DataError, match=r"bad\.jsonl:2: not valid JSON.*--skip-bad-rows"):
        PromptDataset(path)
    ds = PromptDataset(path, skip_bad_rows=True)
    assert [p.prompt for p in ds.prompts] == ["a", "b"]
    assert ds.skipped["bad_row"] == 1


def test_missing_label_key_is_named(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "answer": "1"}])
    with pytest.raises(DataError, match=r"d\.jsonl:1: no key 'label' \(--label-key\); keys are \['answer', 'prompt'\]"):
        PromptDataset(path)
    assert PromptDataset(path, label_key="answer").prompts[0].label == "1"


def test_missing_file_and_empty_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist.*--prompt-data"):
        PromptDataset(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match="no usable rows"):
        PromptDataset(write_jsonl(tmp_path / "e.jsonl", []))


def test_long_prompts_skipped_and_counted(tmp_path: Path, tiny_qwen3: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    path = write_jsonl(
        tmp_path / "d.jsonl", [{"prompt": "1 + 2", "label": "3"}, {"prompt": "word " * 200, "label": "x"}]
    )
    ds = PromptDataset(path, tokenizer=tok, apply_chat_template=True, max_prompt_len=64)
    assert len(ds) == 1 and ds.skipped["prompt_too_long"] == 1
    assert ds.prompts[0].prompt == "<|im_start|>user\n1 + 2<|im_end|>\n<|im_start|>assistant\n"


def test_parquet(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"question": ["a", "b"], "label": ["1", "2"]}), tmp_path / "d.parquet")
    ds = PromptDataset(tmp_path / "d.parquet", input_key="question")
    assert [(p.prompt, p.label) for p in ds.prompts] == [("a", "1"), ("b", "2")]


def test_reasoning_gym_source_example_serves_and_resumes() -> None:
    from argparse import Namespace

    from plugins.data_sources import TASKS, ReasoningGymSource

    args = Namespace(n_samples_per_prompt=2, rollout_seed=7)
    a = ReasoningGymSource(args, tokenizer=None)
    first = a.get_groups(3)
    assert [[s.index for s in g] for g in first] == [[0, 1], [2, 3], [4, 5]]
    assert [g[0].metadata["source_dataset"] for g in first] == [TASKS[0], TASKS[1], TASKS[0]]
    assert first[0][0].prompt == first[0][1].prompt and first[0][0].label is not None
    state = json.loads(json.dumps(a.state_dict()))
    expected = [(g[0].prompt, g[0].label) for g in a.get_groups(2)]
    b = ReasoningGymSource(args, tokenizer=None)
    b.load_state_dict(state)
    assert [(g[0].prompt, g[0].label) for g in b.get_groups(2)] == expected
