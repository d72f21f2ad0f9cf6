"""Megatron-LM's checkpoint layout: atomic saves, the tracker, cut-off checkpoints, retention, --load/--ref-load
resolution in the run, and the checkpoint flags. No Megatron here: torch_dist files are stand-ins."""

from __future__ import annotations

import errno
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from slime_like.arguments import parse_args
from slime_like.run import Run
from slime_like.trainer.megatron import checkpoint_layout as layout
from slime_like.trainer.megatron.checkpoint_layout import CheckpointError, find_checkpoint


def fake_megatron_files(directory: Path) -> None:
    """What Megatron's torch_dist save leaves (metadata.json last)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "common.pt").write_bytes(b"")
    (directory / "__0_0.distcp").write_bytes(b"")
    (directory / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')


def save(root: Path, iteration: int, keep_last: int | None = None) -> Path:
    """One checkpoint of ours, written as Run.save writes it."""
    with layout.saving(root, iteration, keep_last) as tmp:
        fake_megatron_files(tmp)
        layout.write_state(tmp, iteration, {"epoch": 0, "offset": iteration})
    return layout.iteration_dir(root, iteration)


def test_save_writes_megatron_layout_and_tracker_last(tmp_path: Path) -> None:
    directory = save(tmp_path, 2)
    assert directory == tmp_path / "iter_0000002"
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "2"  # as Megatron writes it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000002", "latest_checkpointed_iteration.txt"]
    found = find_checkpoint(tmp_path)
    assert found.directory == directory and found.iteration == 2 and found.note is None
    assert found.state() == {"format": 1, "rollout_id": 2, "rollout_state": {"epoch": 0, "offset": 2}}
    # The same directory named directly, and a save of the same iteration again (resumed from earlier).
    assert find_checkpoint(directory).iteration == 2
    save(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000002", "latest_checkpointed_iteration.txt"]


def test_a_failed_save_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    save(tmp_path, 2)
    with pytest.raises(RuntimeError), layout.saving(tmp_path, 5) as tmp:
        fake_megatron_files(tmp)
        raise RuntimeError("trainer died")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000002", "latest_checkpointed_iteration.txt"]
    # A save killed outright leaves its temporary directory, which nothing loads and the next save replaces.
    (tmp_path / "iter_0000005.tmp").mkdir()
    assert find_checkpoint(tmp_path).iteration == 2
    save(tmp_path, 5)
    assert not (tmp_path / "iter_0000005.tmp").exists() and find_checkpoint(tmp_path).iteration == 5


def test_cut_off_checkpoint_is_never_loaded(tmp_path: Path) -> None:
    save(tmp_path, 2)
    save(tmp_path, 5)
    (tmp_path / "iter_0000005" / layout.COMPLETE_MARKER).unlink()  # e.g. a partial copy
    # The run directory: the previous complete checkpoint, with a note naming the cut-off one.
    found = find_checkpoint(tmp_path)
    assert found.iteration == 2
    assert "iter_0000005 has no slime_like_complete marker" in found.note and "iter_0000002" in found.note
    # The cut-off directory itself: a clear error naming it and the way out.
    with pytest.raises(CheckpointError, match=r"iter_0000005: this checkpoint has no slime_like_complete marker"):
        find_checkpoint(tmp_path / "iter_0000005")
    # Megatron's shards cut off before its metadata.json (a checkpoint of someone else's).
    foreign = tmp_path / "other" / "iter_0000007"
    foreign.mkdir(parents=True)
    (foreign / "__0_0.distcp").write_bytes(b"")
    with pytest.raises(CheckpointError, match="has no Megatron metadata.json"):
        find_checkpoint(foreign)


def test_resume_advice_names_the_last_complete_checkpoint(tmp_path: Path) -> None:
    assert "no checkpoint to resume from (no --save)" in layout.resume_advice(None)
    assert f"no complete checkpoint under --save {tmp_path} yet" in layout.resume_advice(tmp_path)
    save(tmp_path, 2)
    (tmp_path / "iter_0000005.tmp").mkdir()  # a save cut off: passed over
    advice = f"The last complete checkpoint is {tmp_path / 'iter_0000002'}: resume with --load {tmp_path}."
    assert layout.resume_advice(tmp_path) == advice
    save(tmp_path, 5)
    (tmp_path / "iter_0000005" / layout.COMPLETE_MARKER).unlink()  # named by the tracker, but incomplete
    assert layout.resume_advice(tmp_path) == advice


def test_tracker_naming_a_missing_iteration(tmp_path: Path) -> None:
    save(tmp_path, 2)
    layout.write_tracker(tmp_path, 9)
    found = find_checkpoint(tmp_path)
    assert found.iteration == 2 and "iter_0000009 does not exist" in found.note
    # Nothing complete before it: the error names the tracker, the checkpoint and both ways out.
    empty = tmp_path / "empty"
    empty.mkdir()
    layout.write_tracker(empty, 3)
    with pytest.raises(CheckpointError) as error:
        find_checkpoint(empty)
    message = str(error.value)
    assert "names iter_0000003, which does not exist" in message and "remove" in message
    (empty / layout.TRACKER).write_text("latest\n")
    with pytest.raises(CheckpointError, match="not an iteration number or 'release'"):
        find_checkpoint(empty)


def test_slime_checkpoint_and_release_layouts(tmp_path: Path) -> None:
    # slime: tracker "19" (Megatron writes no newline, reads with strip), torch_dist shards, no state of ours.
    fake_megatron_files(tmp_path / "slime" / "iter_0000019")
    (tmp_path / "slime" / layout.TRACKER).write_text("19\n")
    found = find_checkpoint(tmp_path / "slime")
    assert found.iteration == 19 and found.state() is None and not found.release
    # The converter's release layout.
    fake_megatron_files(tmp_path / "ref" / "release")
    layout.write_tracker(tmp_path / "ref", None)
    assert (tmp_path / "ref" / layout.TRACKER).read_text() == "release"
    assert find_checkpoint(tmp_path / "ref").release and find_checkpoint(tmp_path / "ref" / "release").release
    # No tracker, not a checkpoint directory: nothing to load (the run falls back to --ref-load).
    assert find_checkpoint(tmp_path) is None
    with pytest.raises(CheckpointError, match="convert_hf_to_torch_dist"):
        layout.require_checkpoint(tmp_path, "--ref-load")


def test_retention_keeps_the_last_n(tmp_path: Path) -> None:
    fake_megatron_files(tmp_path / "release")
    for iteration in (1, 3, 5, 7):
        save(tmp_path, iteration, keep_last=2)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["iter_0000005", "iter_0000007", "latest_checkpointed_iteration.txt", "release"]
    # After a resume from iter 5 the next save is iter 6: the abandoned iter 7 is not counted, nor deleted.
    save(tmp_path, 6, keep_last=1)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("iter_")) == ["iter_0000006", "iter_0000007"]


class FakeRun:
    """Run's checkpoint methods over stand-ins for the trainer ranks and the rollout manager."""

    save = Run.save
    _load = Run._load
    _start_from_weights = Run._start_from_weights

    def __init__(self, args: SimpleNamespace) -> None:
        self.args = args
        self.calls: list[tuple] = []
        self.trainer = SimpleNamespace(
            load=lambda d, load_optimizer=True, load_rng=True: self.calls.append(("load", d, load_optimizer, load_rng)),
            save=lambda d, iteration: fake_megatron_files(Path(d)),
        )
        self.rollout = SimpleNamespace(
            state_dict=SimpleNamespace(remote=lambda: {"offset": 4}),
            load_state_dict=SimpleNamespace(remote=lambda state: self.calls.append(("data", state))),
        )

    def update_weights(self, rollout_id: int, force: bool = False) -> None:
        self.calls.append(("version", rollout_id + 1))


def run_args(**overrides: object) -> SimpleNamespace:
    args = dict(save=None, save_interval=None, num_rollout=6, keep_last_n_checkpoints=None, load=None)
    args.update(ref_load=None, finetune=False, no_load_optim=False, no_load_rng=False)
    args.update(data_source_path=None, rollout_seed=42)
    return SimpleNamespace(**{**args, **overrides})


@pytest.fixture
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("slime_like.run.ray.get", lambda value: value)


def test_run_saves_and_resumes(tmp_path: Path, no_ray: None) -> None:
    run = FakeRun(run_args(save=str(tmp_path), save_interval=3, keep_last_n_checkpoints=1))
    for rollout_id in range(6):
        run.save(rollout_id)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000005", "latest_checkpointed_iteration.txt"]
    resumed = FakeRun(run_args(load=str(tmp_path), no_load_rng=True))
    assert resumed._load() == 6
    d = str(tmp_path / "iter_0000005")
    assert resumed.calls == [("load", d, True, False), ("data", {"offset": 4}), ("version", 6)]


def test_disk_full_during_a_save_keeps_the_previous_checkpoint(
    tmp_path: Path, no_ray: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = FakeRun(run_args(save=str(tmp_path), save_interval=3))
    run.save(2)

    def disk_full(directory: str, iteration: int) -> None:
        fake_megatron_files(Path(directory))  # some shards made it to disk, then the disk filled up
        raise OSError(errno.ENOSPC, "No space left on device", str(Path(directory) / "__1_0.distcp"))

    run.trainer.save = disk_full
    with pytest.raises(layout.CheckpointSaveError) as info:
        run.save(5)
    message = str(info.value)
    assert info.value.errno == errno.ENOSPC and isinstance(info.value.__cause__, OSError)
    assert f"saving checkpoint iter_0000005 under {tmp_path}: the disk is full" in message
    assert f"iter_0000002 is still the checkpoint there (--load {tmp_path} resumes from it)" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000002", "latest_checkpointed_iteration.txt"]
    assert find_checkpoint(tmp_path).iteration == 2
    # The same error from a trainer rank arrives as Ray's error text; the tracker write can fail as well.
    run.trainer.save = lambda d, i: (_ for _ in ()).throw(RuntimeError("rank 1: OSError: No space left on device"))
    with pytest.raises(layout.CheckpointSaveError, match="the disk is full"):
        run.save(5)
    run.trainer.save = lambda d, i: fake_megatron_files(Path(d))
    write_tracker = layout.write_tracker

    def tracker_disk_full(root: Path, iteration: int | None) -> None:
        raise OSError(errno.EDQUOT, "Disk quota exceeded")

    monkeypatch.setattr(layout, "write_tracker", tracker_disk_full)
    with pytest.raises(layout.CheckpointSaveError, match="iter_0000002 is still the checkpoint there"):
        run.save(5)
    monkeypatch.setattr(layout, "write_tracker", write_tracker)
    assert find_checkpoint(tmp_path).iteration == 2  # the tracker still names it
    # Other failures are not called a full disk.
    run.trainer.save = lambda d, i: (_ for _ in ()).throw(RuntimeError("trainer died"))
    with pytest.raises(RuntimeError, match="trainer died") as other:
        run.save(8)
    assert not isinstance(other.value, layout.CheckpointSaveError)


def test_run_load_falls_back_to_ref_load(tmp_path: Path, no_ray: None, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "run").mkdir()
    fake_megatron_files(tmp_path / "ref" / "release")
    layout.write_tracker(tmp_path / "ref", None)
    run = FakeRun(run_args(load=str(tmp_path / "run"), ref_load=str(tmp_path / "ref")))
    with caplog.at_level(logging.INFO, logger="slime_like.run"):
        assert run._load() == 0
    # Model weights only, optimizer and RNG fresh; the servers get them as weight version 0.
    assert run.calls == [("load", str(tmp_path / "ref" / "release"), False, False), ("version", 0)]
    assert "holds no checkpoint (no latest_checkpointed_iteration.txt): starting from the weights of --ref-load" in (
        caplog.text
    )
    # Without --ref-load the run starts from --hf-checkpoint, and says so.
    run = FakeRun(run_args(load=str(tmp_path / "run")))
    with caplog.at_level(logging.INFO, logger="slime_like.run"):
        assert run._load() == 0
    assert run.calls == [] and "starting from --hf-checkpoint at rollout 0" in caplog.text


def test_run_loads_a_slime_checkpoint(tmp_path: Path, no_ray: None, caplog: pytest.LogCaptureFixture) -> None:
    fake_megatron_files(tmp_path / "iter_0000019")
    (tmp_path / layout.TRACKER).write_text("19")
    (tmp_path / "rollout").mkdir()  # slime's data position lives here, but this run saved none
    run = FakeRun(run_args(load=str(tmp_path)))
    with caplog.at_level(logging.INFO, logger="slime_like.run"):
        assert run._load() == 20  # slime's iteration is the 0-based rollout id
    assert run.calls == [("load", str(tmp_path / "iter_0000019"), True, True), ("version", 20)]
    assert "slime saved no data position" in caplog.text and "the data starts from its beginning" in caplog.text
    # --finetune: weights only, from rollout 0.
    run = FakeRun(run_args(load=str(tmp_path), finetune=True))
    assert run._load() == 0 and run.calls == [("load", str(tmp_path / "iter_0000019"), False, False), ("version", 0)]


def test_checkpoint_flags(base: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake_megatron_files(tmp_path / "ref" / "release")
    layout.write_tracker(tmp_path / "ref", None)
    args = parse_args(base + ["--ref-load", str(tmp_path / "ref"), "--load", str(tmp_path), "--no-load-optim"])
    assert args.ref_load == str(tmp_path / "ref") and args.no_load_optim and not args.finetune
    assert args.keep_last_n_checkpoints is None
    save(tmp_path / "run", 4)
    (tmp_path / "run" / "iter_0000004" / layout.COMPLETE_MARKER).unlink()
    for flags, message in [
        (["--keep-last-n-checkpoints", "2"], "--keep-last-n-checkpoints needs --save DIR"),
        (["--keep-last-n-checkpoints", "0", "--save", "x"], "--keep-last-n-checkpoints 0 must be >= 1"),
        (["--finetune"], "--finetune applies to what --load loads"),
        (["--ref-load", str(tmp_path)], f"--ref-load {tmp_path}: no Megatron checkpoint there"),
        (["--load", str(tmp_path / "run")], "names iter_0000004, which has no slime_like_complete marker"),
    ]:
        with pytest.raises(SystemExit):
            parse_args(base + flags)
        assert message in capsys.readouterr().err, flags
    # The run directory, state file and tracker are plain JSON/text a user can read.
    assert json.loads((tmp_path / "run" / "iter_0000004" / layout.STATE_FILE).read_text())["rollout_id"] == 4


def slime_data_position(root: Path, rollout_id: int, **state: object) -> None:
    """The file slime's data source saves beside its checkpoint of rollout_id (torch.save of a plain dict)."""
    import torch

    (root / "rollout").mkdir(exist_ok=True)
    torch.save({"metadata": {}, **state}, root / "rollout" / f"global_dataset_state_dict_{rollout_id}.pt")


@pytest.mark.parametrize("shuffle", [False, True])
def test_run_restores_slime_data_position(tmp_path: Path, no_ray: None, shuffle: bool) -> None:
    from buffer.data_source import DataSource, PromptDataset

    fake_megatron_files(tmp_path / "iter_0000004")
    (tmp_path / layout.TRACKER).write_text("4")
    # 5 prompts, 2 per rollout: after rollouts 0-4 slime took 10 prompts, the end of epoch 1 (its offset 5).
    # Then, with its group counter at 10 and sample counter at 20 (2 samples per prompt):
    slime_data_position(tmp_path, 4, sample_offset=5, epoch_id=1, sample_group_index=10, sample_index=20)
    run = FakeRun(run_args(load=str(tmp_path)))
    assert run._load() == 5
    (data_call,) = [c for c in run.calls if c[0] == "data"]
    state = data_call[1]
    assert state == {"source": {"epoch": 1, "offset": 5, "next_group_index": 10, "seed": 42}, "returned": []}
    # Our source continues where slime's would: epoch 2, whose order slime makes by random.seed(42 + 2) and
    # random.shuffle of range(5) (or the file's order without --rollout-shuffle), groups 10 and 11 next.
    rows = tmp_path / "d.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"q{i}", "label": str(i)}) + "\n" for i in range(5)))
    source = DataSource(PromptDataset(rows), 2, shuffle=shuffle, seed=42)
    source.load_state_dict(state["source"])
    import random

    order = list(range(5))
    if shuffle:
        random.seed(42 + 2)
        random.shuffle(order)
    groups = source.get_groups(2)
    assert [g[0].prompt for g in groups] == [f"q{order[0]}", f"q{order[1]}"]
    assert [[s.index for s in g] for g in groups] == [[20, 21], [22, 23]]  # slime's sample_index goes on
    assert [g[0].group_index for g in groups] == [10, 11]


def test_slime_data_position_read_errors(tmp_path: Path, no_ray: None) -> None:
    fake_megatron_files(tmp_path / "iter_0000002")
    (tmp_path / layout.TRACKER).write_text("2")
    checkpoint = find_checkpoint(tmp_path)
    assert layout.read_slime_data_state(checkpoint) is None
    (tmp_path / "rollout").mkdir()
    (tmp_path / "rollout" / "global_dataset_state_dict_2.pt").write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match="global_dataset_state_dict_2.pt: cannot read slime's data position"):
        layout.read_slime_data_state(checkpoint)
    # With --data-source-path the source keeps its own state: slime's position is not forced on it.
    slime_data_position(tmp_path, 2, sample_offset=1, epoch_id=0, sample_group_index=1, sample_index=2)
    run = FakeRun(run_args(load=str(tmp_path), data_source_path="pkg.Source"))
    assert run._load() == 3 and not [c for c in run.calls if c[0] == "data"]
